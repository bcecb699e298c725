"""Which start-up phase SGLang is in, read from its own log lines (pure: no I/O, no clock).

A cold start of a wide-EP model takes many minutes (weights, DeepGEMM's JIT, CUDA graphs) and
looks like a hung pod from outside; SGLang logs where it is, so the launcher feeds every line
of its output here (supervisor.py) and the sidecar reports the phase. Each phase is entered by
the first line that carries its marker and the phase only moves forward: every TP rank logs the
same markers, and a marker of an earlier phase (a late rank, a second graph capture) is ignored.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from moe_contract.startup import START_PHASES, StartPhase

MAX_LINE = 64 * 1024  # longer lines are matched on their head (SGLang's markers start a line)

# Substrings of SGLang 0.5.23's log lines (paths under sglang/srt/), all logger.info on every
# rank unless said otherwise. Lines carry a prefix, e.g. "[2026-01-01 00:00:00 DP3 TP3 EP3] ".
MARKERS: tuple[tuple[str, StartPhase], ...] = (
    # distributed/bootstrap.py:init_parallel_runtime
    ("Init parallel begin.", "distributed_init"),
    # model_executor/model_runner.py:ModelRunner.load_model
    ("Load weight begin.", "loading_weights"),
    # mem_cache/memory_pool.py:KVCache._finalize_allocation_log prints "[<label> ]KV Cache is
    # allocated." or, with post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, non-MLA),
    # "KV Cache VA upper bound." at the same point
    ("KV Cache is allocated.", "kv_cache"),
    ("KV Cache VA upper bound.", "kv_cache"),
    # model_executor/model_runner_components/cuda_graph_setup.py:capture_prefill_graph and
    # capture_decode_graph: "Capture target prefill CUDA graph begin.", "Capture target decode
    # CUDA graph begin." ("target verify" with speculative decoding)
    ("CUDA graph begin.", "cuda_graphs"),
    # layers/deep_gemm_wrapper/compile_utils.py:_maybe_compile_deep_gemm_one_type_all (a warning,
    # first rank of the node only). The JIT runs lazily on a kernel's first use, which is the
    # first forward of the graph capture (runner/decode_cuda_graph_runner.py:_capture): so it
    # comes after "CUDA graph begin.", not before
    ("Entering DeepGEMM JIT Pre-Compile session", "deepgemm_warmup"),
    # entrypoints/http_server.py:_execute_server_warmup (P/D disaggregation only; rank 0 only)
    ("Start of pd disaggregation warmup", "warmup"),
    # entrypoints/http_server.py:_wait_and_warmup (rank 0 only: node ranks >= 1 print nothing
    # when ready, the sidecar's first ready health check ends their start instead, state.py)
    ("The server is fired up and ready to roll!", "ready"),
)
_RANK = {phase: i for i, phase in enumerate(START_PHASES)}


class StartTracker:
    """The engine's phase and when it entered each (wall-clock seconds). Thread-safe: the
    launcher's output pumps feed it while the sidecar's event loop reads it."""

    def __init__(self, started_at: float) -> None:
        self._entered: dict[StartPhase, float] = {"launching": started_at}
        self._phase: StartPhase = "launching"
        self._lock = threading.Lock()

    @property
    def phase(self) -> StartPhase:
        return self._phase

    def feed(self, line: str, now: float) -> None:
        """One line of the engine's output (any prefix, with or without its newline)."""
        if self._phase == "ready":
            return
        head = line[:MAX_LINE]
        for marker, phase in MARKERS:
            if marker in head:
                self.advance(phase, now)
                return

    def advance(self, phase: StartPhase, now: float) -> None:
        """Enter ``phase`` unless the engine is there or past it already."""
        with self._lock:
            if _RANK[phase] > _RANK[self._phase]:
                self._phase = phase
                self._entered[phase] = now

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """{"phase", "since": seconds in it, "phases": {phase: entered at}} (skipped phases absent)."""
        now = time.time() if now is None else now
        with self._lock:
            phase, entered = self._phase, dict(self._entered)
        return {"phase": phase, "since": max(0.0, now - entered[phase]), "phases": entered}


class LineBuffer:
    """Splits a byte stream into lines for matching, holding at most ``cap`` bytes: the rest of a
    longer line (a progress bar redrawn with carriage returns for MBs) is dropped until its end."""

    def __init__(self, cap: int = MAX_LINE) -> None:
        self.cap = cap
        self._head = bytearray()
        self._full = False  # the current line reached the cap: skip to its end

    def feed(self, chunk: bytes) -> list[str]:
        """The lines that ``chunk`` completes (a carriage return ends one too), decoded leniently."""
        lines: list[str] = []
        *done, rest = chunk.replace(b"\r", b"\n").split(b"\n")
        for part in done:
            self._take(part)
            if self._head:
                lines.append(self._head.decode("utf-8", "replace"))
            self._head.clear()
            self._full = False
        self._take(rest)
        return lines

    def _take(self, part: bytes) -> None:
        if not self._full:
            self._head += part[: self.cap - len(self._head)]
            self._full = len(self._head) >= self.cap
