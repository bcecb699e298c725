"""The replay loop: one synthetic forward pass at a time, per EPLB mode as SGLang behaves.

Per pass it does what SGLang's recorder does with the routed counts: spread them over the
physical copies by the dispatch rule, sum per GPU and report the pass's balancedness
(SGLang's formula, averaged over all layers, dense layers count as 1.0), and record the
pass in the expert-distribution recorder's circular buffer. Then, by mode:

- ``operator`` and ``engine`` (SGLang runs with ``--enable-eplb``): every
  ``rebalance_iterations`` passes the EPLB manager takes the recorder's window and calls
  ``rebalance_experts``, i.e. the plugin's hook (``moe_runtime.eplb_hook``);
- ``static`` (no ``--enable-eplb``, recorder on): no rebalance ever; the window leaves only
  through ``/dump_expert_distribution_record`` (the sidecar's recorder source);
- ``off``: no rebalance, no recorder.

A dump resets the recorder in every mode, as in SGLang: in operator/engine modes it would
steal EPLB's window (the sidecar never dumps there).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from moe_placement.maps import (
    Dispatch,
    FloatArray,
    IntArray,
    balancedness,
    gpu_loads,
    slot_shares,
    trivial_map,
)
from moe_runtime import eplb_hook, exchange, recorder
from moe_runtime.eplb_hook import EplbMode
from moe_runtime.replay.baseline import deepseek_global
from moe_runtime.replay.load import LoadModel
from moe_runtime.replay.sglang_metrics import SGLangMetrics
from moe_runtime.replay.trace import StreamingTrace, TraceConfig

log = logging.getLogger("moe_runtime.replay")


@dataclass(frozen=True)
class ReplayOptions:
    trace: TraceConfig = field(default_factory=TraceConfig)
    dense_layers: int = 0
    num_gpus: int = 32
    gpus_per_node: int = 8
    num_redundant: int = 32
    num_groups: int | None = None
    rebalance_iterations: int = 1000  # also the recorder's buffer, as SGLang sizes it
    pass_interval_s: float = 0.05
    dispatch: Dispatch = "static"
    forward_mode: Literal["extend", "decode"] = "decode"
    mode: EplbMode = "operator"
    auto_record: bool = True  # SGLang starts recording at boot when it reports balancedness

    @property
    def num_physical(self) -> int:
        return self.trace.num_experts + self.num_redundant

    @property
    def num_layers(self) -> int:
        return self.dense_layers + self.trace.num_layers

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def rebalances(self) -> bool:
        """SGLang's EPLB manager runs (and calls the plugin) only with --enable-eplb."""
        return self.mode in ("operator", "engine")

    @property
    def records(self) -> bool:
        """The recorder exists: with EPLB, or in static mode where the launcher turns it on."""
        return self.mode != "off"


class RecorderUnavailable(Exception):
    """SGLang without --expert-distribution-recorder-mode refuses recorder requests."""


class StandInRecorder:
    """SGLang's stat-mode recorder: a circular buffer of per-pass logical counts [B, L, E]."""

    def __init__(self, buffer: int, layers: int, experts: int, recording: bool) -> None:
        self.buffer = np.zeros((buffer, layers, experts), dtype=np.int32)
        self.index = 0
        self.recording = recording
        self.dumps = 0
        self._lock = threading.Lock()

    def record(self, counts: IntArray) -> None:
        with self._lock:
            if self.recording:
                self.buffer[self.index] = counts
                self.index = (self.index + 1) % len(self.buffer)

    def _reset(self) -> None:
        self.buffer[...] = 0  # the write index stays where it is, as in SGLang's _CircularBuffer

    def start(self) -> None:
        with self._lock:
            self._reset()
            self.recording = True

    def stop(self) -> None:
        with self._lock:
            self.recording = False

    def take(self) -> tuple[IntArray, int, exchange.StepArray | None]:
        """dump_record(output_mode="object"), as the EPLB manager calls it: the window, then reset;
        and the step samples the plugin reads from it with the ring's write index."""
        with self._lock:
            counts, passes, steps = eplb_hook.window_with_steps(self.buffer, self.index)
            self._reset()
        return counts, passes, steps

    def dump(self, directory: Path) -> Path:
        """dump_record() as /dump_expert_distribution_record runs it on rank 0: a file, then reset."""
        with self._lock:
            data = self.buffer.copy()
            self._reset()
            self.dumps += 1
        path = directory / recorder.dump_name()
        recorder.write_dump(path, data)
        return path


class ReplayEngine:
    def __init__(
        self,
        opts: ReplayOptions,
        hook: eplb_hook.HookState,
        sglang: SGLangMetrics,
        load: LoadModel | None = None,
    ) -> None:
        if opts.num_physical % opts.num_gpus:
            raise ValueError(
                f"experts + redundant = {opts.num_physical} must be a multiple of the {opts.num_gpus} GPUs"
            )
        self.opts = opts
        self.hook = hook
        self.sglang = sglang
        self.load = load
        self.trace = StreamingTrace(opts.trace, opts.dense_layers)
        t = opts.trace
        self.shape = eplb_hook.EngineShape(
            num_layers=opts.num_layers,
            num_logical=t.num_experts,
            num_physical=opts.num_physical,
            num_gpus=opts.num_gpus,
            num_nodes=opts.num_nodes,
            num_groups=opts.num_groups,
        )
        self.phy2log: IntArray = trivial_map(opts.num_layers, t.num_experts, opts.num_physical)
        self.shares: FloatArray = self._shares(self.phy2log)
        self.recorder = (
            StandInRecorder(
                opts.rebalance_iterations,
                opts.num_layers,
                t.num_experts,
                recording=opts.rebalances or opts.auto_record,
            )
            if opts.records
            else None
        )
        self.passes = 0
        self.rebalances = 0
        self.last_decision: eplb_hook.Decision | None = None
        self.shifts = 0
        self._pending_shift: int | None = None
        self._shift_lock = threading.Lock()
        self._stop = threading.Event()

    def _shares(self, phy2log: IntArray) -> FloatArray:
        return slot_shares(
            phy2log,
            self.opts.trace.num_experts,
            self.opts.num_gpus,
            dispatch=self.opts.dispatch,
            gpus_per_node=self.opts.gpus_per_node,
        )

    def set_map(self, phy2log: IntArray) -> None:
        self.phy2log = phy2log
        self.shares = self._shares(phy2log)

    def request_shift(self, seed: int) -> None:
        """Shift the traffic mix before the next pass (test/demo facility; see StreamingTrace.shift)."""
        with self._shift_lock:
            self._pending_shift = seed

    def step(self) -> float:
        """One forward pass; returns its balancedness as SGLang would report it."""
        with self._shift_lock:
            seed, self._pending_shift = self._pending_shift, None
        if seed is not None:  # applied here, in the replay thread, so a pass never sees half a shift
            self.trace.shift(seed)
            self.shifts += 1
            log.info("traffic shifted (seed %d)", seed)
        counts = self.trace.next_pass()
        gpu = gpu_loads(counts, self.phy2log, self.shares, self.opts.num_gpus)
        bal = float(balancedness(gpu).mean())
        self.sglang.observe_pass(bal, self.opts.forward_mode)
        if self.recorder is not None:
            self.recorder.record(counts)
        self.passes += 1
        if self.opts.rebalances and self.passes % self.opts.rebalance_iterations == 0:
            self.rebalance()
        return bal

    def rebalance(self) -> eplb_hook.Decision:
        """The hook, called with the window SGLang's EPLBManager would hand over."""
        assert self.opts.rebalances and self.recorder is not None, "SGLang rebalances only with EPLB on"
        window, passes, steps = self.recorder.take()
        shape = self.shape

        def original() -> IntArray:
            return deepseek_global(window, shape.num_gpus, shape.num_redundant)

        decision, applied = eplb_hook.rebalance_single_process(
            self.hook, window, passes, shape, original, current=self.phy2log, steps=steps
        )
        self.set_map(applied)
        self.rebalances += 1
        self.last_decision = decision
        log.info("rebalance %d: %s (%s)", self.rebalances, decision.source, decision.reason)
        return decision

    def dump(self, directory: Path) -> Path:
        if self.recorder is None:
            raise RecorderUnavailable(
                "Please set ServerArgs.expert_distribution_recorder_mode to use ExpertDistributionRecorder."
            )
        return self.recorder.dump(directory)

    def run(self) -> None:
        """Blocking loop (run it in a thread); stops on stop()."""
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step()
                if self.load is not None:
                    self.load.advance(time.monotonic())
            except Exception:
                log.exception("replay pass failed")
            interval = self.opts.pass_interval_s
            if interval > 0:
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    next_at = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
