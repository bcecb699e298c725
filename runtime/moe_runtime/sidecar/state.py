"""What the sidecar knows: recent load windows (bounded ring), the operator's placement,
the map the engine applied, the plugin's counters, and the engine's start-up phase. No I/O
except the exchange files.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from moe_contract.windows_wire import WireWindow
from moe_placement import document
from moe_placement.document import PlacementDoc
from moe_placement.maps import (
    Dispatch,
    FloatArray,
    IntArray,
    PlacementError,
    balancedness,
    gpu_loads,
    max_over_mean,
    slot_shares,
    trivial_map,
    validate_map,
)
from moe_runtime import exchange
from moe_runtime.launcher.startup import StartTracker

DEFAULT_RING = 64  # DeepSeek-V3 windows are ~125 kB each: 64 of them are ~8 MB


@dataclass(frozen=True)
class EngineLayout:
    """What the sidecar knows of the engine's expert layout (from config and first window)."""

    num_gpus: int | None = None
    gpus_per_node: int | None = None
    num_redundant: int = 0
    num_layers: int | None = None
    num_experts: int | None = None
    top_k: int | None = None
    dispatch: Dispatch = "static"

    @property
    def num_physical(self) -> int | None:
        return None if self.num_experts is None else self.num_experts + self.num_redundant


@dataclass(frozen=True)
class Window:
    seq: int
    record: exchange.WindowRecord
    applied_source: str | None
    applied_version: int | None

    @property
    def assignments(self) -> int:
        return int(self.record.counts.sum())

    def tokens(self, top_k: int | None) -> float | None:
        """Routed tokens: the busiest layer's assignments / top_k (dense layers count nothing)."""
        if not top_k:
            return None
        return float(self.record.counts.sum(axis=1).max()) / top_k

    def to_json(self, top_k: int | None, *, counts: bool = True, steps: bool = False) -> dict[str, Any]:
        rec = self.record
        doc: dict[str, Any] = {
            "seq": self.seq,
            "started_at": rec.started_at,
            "ended_at": rec.ended_at,
            "passes": rec.passes,
            "assignments": self.assignments,
            "tokens": self.tokens(top_k),
            "num_layers": int(rec.counts.shape[0]),
            "num_experts": int(rec.counts.shape[1]),
            "placement": {"source": self.applied_source, "version": self.applied_version},
            "step_samples": 0 if rec.steps is None else int(rec.steps.shape[0]),
        }
        if counts:
            doc["counts"] = rec.counts.tolist()
        if steps and rec.steps is not None:
            doc["steps"] = rec.steps.tolist()
        return doc

    def to_wire(self, *, steps: bool = False) -> WireWindow:
        """What the binary answer carries of it (moe_contract.windows_wire): what the operator reads."""
        rec = self.record
        return WireWindow(
            self.seq, rec.started_at, rec.ended_at, rec.passes, rec.counts, rec.steps if steps else None
        )


@dataclass(frozen=True)
class Evaluation:
    """The current placement scored on one window's traffic (layers without traffic left out)."""

    layers: IntArray
    balancedness: FloatArray
    max_mean: FloatArray
    hottest_share: float
    hottest_fair_ratio: float


@dataclass
class Applied:
    source: str
    version: int | None
    applied_at: float
    phy2log: IntArray


class PushRejected(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class SidecarState:
    state_dir: Path
    layout: EngineLayout = field(default_factory=EngineLayout)
    ring_size: int = DEFAULT_RING
    windows: deque[Window] = field(init=False)
    seq: int = 0
    pushed: PlacementDoc | None = None
    pushed_received_at: float | None = None
    applied: Applied | None = None
    plugin_status: dict[str, Any] = field(default_factory=dict)
    _engine_ready: bool = False
    engine_reason: str = "not checked yet"
    draining: bool = False
    start: StartTracker | None = None  # set by `launch`, which reads the engine's output
    _shares_src: IntArray | None = None
    _shares: FloatArray | None = None
    _trivial: IntArray | None = None
    _applied_key: exchange.FileKey | None = None
    _status_key: exchange.FileKey | None = None
    status_refused: int = 0  # versions of plugin-status.json refused (exchange.plugin_status_of)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.windows = deque(maxlen=self.ring_size)
        self.pushed = self._load_pushed()

    # ------------------------------------------------------------ engine

    @property
    def engine_ready(self) -> bool:
        return self._engine_ready

    @engine_ready.setter
    def engine_ready(self, ready: bool) -> None:
        # Node ranks >= 1 log nothing when ready (their placeholder /health just starts
        # answering): the first ready health check ends their start. On rank 0 /ready turns 200
        # just before "The server is fired up and ready to roll!" (http_server.py:_wait_and_warmup).
        self._engine_ready = ready
        if ready and self.start is not None:
            self.start.advance("ready", time.time())

    def start_status(self) -> dict[str, Any] | None:
        """The engine's start-up phase (StartTracker.snapshot); None when no engine output is read
        here (`moe-runtime sidecar`, the replay engine)."""
        return None if self.start is None else self.start.snapshot()

    # ------------------------------------------------------------ windows

    def ingest(self, record: exchange.WindowRecord) -> Window:
        counts = record.counts
        layout = self.layout
        if layout.num_layers is None or layout.num_experts is None:
            gpus = record.meta.get("num_gpus", layout.num_gpus)
            physical = record.meta.get("num_physical")
            redundant = (int(physical) - counts.shape[1]) if physical else layout.num_redundant
            self.layout = EngineLayout(
                num_gpus=int(gpus) if gpus else None,
                gpus_per_node=layout.gpus_per_node,
                num_redundant=redundant,
                num_layers=int(counts.shape[0]),
                num_experts=int(counts.shape[1]),
                top_k=layout.top_k,
                dispatch=layout.dispatch,
            )
        applied = self.applied
        with self._lock:
            self.seq += 1
            window = Window(
                self.seq, record, applied.source if applied else None, applied.version if applied else None
            )
            if self.windows and self.windows[-1].record.steps is not None:
                # only the newest window keeps its step samples (the planner reads those alone):
                # a ring of DeepSeek-V3 windows with theirs would be 128 MB
                prev = self.windows[-1]
                self.windows[-1] = replace(prev, record=replace(prev.record, steps=None))
            self.windows.append(window)
        return window

    def windows_after(self, after: int, limit: int) -> list[Window]:
        with self._lock:
            items = [w for w in self.windows if w.seq > after]
        return items[:limit]

    def current_map(self) -> IntArray | None:
        """The applied map, else SGLang's trivial one when the shape is known."""
        if self.applied is not None:
            return self.applied.phy2log
        lay = self.layout
        if lay.num_layers is None or lay.num_experts is None or lay.num_physical is None:
            return None
        if self._trivial is None or self._trivial.shape != (lay.num_layers, lay.num_physical):
            self._trivial = trivial_map(lay.num_layers, lay.num_experts, lay.num_physical)
        return self._trivial

    def evaluate(self, counts: IntArray) -> Evaluation | None:
        """Score the current placement on a window; None when the GPU count is unknown."""
        phy2log = self.current_map()
        gpus = self.layout.num_gpus
        if phy2log is None or not gpus or phy2log.shape[0] != counts.shape[0]:
            return None
        if phy2log.shape[1] % gpus or int(phy2log.max()) >= counts.shape[1]:
            return None
        shares = self._slot_shares(phy2log, counts.shape[1], gpus)
        per_layer = counts.sum(axis=1)
        active = np.flatnonzero(per_layer > 0)
        if active.size == 0:
            return None
        gpu = gpu_loads(counts[active], phy2log[active], shares[active], gpus)
        top = counts[active].max(axis=1) / per_layer[active]
        return Evaluation(
            layers=active.astype(np.int64),
            balancedness=balancedness(gpu),
            max_mean=max_over_mean(gpu),
            hottest_share=float(top.max()),
            hottest_fair_ratio=float(top.max() * counts.shape[1]),
        )

    def _slot_shares(self, phy2log: IntArray, num_logical: int, gpus: int) -> FloatArray:
        if self._shares is None or self._shares_src is not phy2log:
            gpn = self.layout.gpus_per_node
            self._shares = slot_shares(
                phy2log, num_logical, gpus, dispatch=self.layout.dispatch, gpus_per_node=gpn
            )
            self._shares_src = phy2log
        return self._shares

    # ------------------------------------------------------------ placement

    def push(self, body: Any, now: float | None = None) -> tuple[str, PlacementDoc]:
        """Validate and accept an operator placement; 'accepted' or 'refreshed'. Raises PushRejected."""
        now = time.time() if now is None else now
        try:
            doc = document.parse(body, now=now, default_generated_at=now)
        except ValueError as exc:
            raise PushRejected(400, str(exc)) from exc
        arr = self._validate(doc.physical_to_logical_map)
        doc = PlacementDoc(doc.version, arr, doc.generated_at, doc.source, doc.extra)
        current = self.pushed
        outcome = "accepted"
        if current is not None:
            if doc.version < current.version:
                raise PushRejected(409, f"version {doc.version} is older than the current {current.version}")
            if doc.version == current.version:
                if not np.array_equal(arr, current.physical_to_logical_map):
                    raise PushRejected(409, f"version {doc.version} exists with a different map")
                outcome = "refreshed"
        exchange.write_placement(exchange.placement_path(self.state_dir), doc, {"received_at": now})
        self.pushed, self.pushed_received_at = doc, now
        return outcome, doc

    def _validate(self, raw: Any) -> IntArray:
        lay = self.layout
        arr = np.asarray(raw)
        slots = arr.shape[-1] if arr.ndim == 2 else 0
        num_logical = lay.num_experts if lay.num_experts is not None else slots - lay.num_redundant
        try:
            return validate_map(
                arr,
                num_layers=lay.num_layers,
                num_logical=max(num_logical, 1),
                num_physical=num_logical + lay.num_redundant,
                num_gpus=lay.num_gpus,
            )
        except PlacementError as exc:
            raise PushRejected(422, str(exc)) from exc

    def _load_pushed(self) -> PlacementDoc | None:
        doc, _ = exchange.CachedPlacementFile(exchange.placement_path(self.state_dir)).load()
        return doc

    # ------------------------------------------------------------ plugin files

    def refresh_plugin_files(self) -> bool:
        """Pick up applied.npz and plugin-status.json; True when the applied map changed,
        ValueError when a new applied.npz is refused (counted by the caller, not read again)."""
        self._refresh_status()
        key = exchange.file_key(exchange.applied_path(self.state_dir))
        if key is None or key == self._applied_key:
            return False
        self._applied_key = key  # a refused version is not read again until it changes
        got = exchange.read_applied(self.state_dir)
        if got is None or got[0].ndim != 2:
            raise ValueError(
                "applied.npz refused: not a regular file, too large, or not as the plugin writes it"
            )
        arr, meta = got
        version = meta.get("version")
        self.applied = Applied(
            str(meta.get("source", "unknown")),
            version if isinstance(version, int) else None,
            float(meta.get("applied_at", 0.0)),
            arr,
        )
        return True

    def _refresh_status(self) -> None:
        """plugin-status.json, parsed only when it changed; a refused version leaves the
        status read before it in place (and is counted)."""
        path = exchange.plugin_status_path(self.state_dir)
        key = exchange.file_key(path)
        if key is None or key == self._status_key:
            return
        self._status_key = key
        status = exchange.read_plugin_status(path)
        if status is None:
            self.status_refused += 1
        else:
            self.plugin_status = status

    def set_initial(self, source: str, version: int | None, phy2log: IntArray) -> None:
        """The map the engine boots with (launcher's --init-expert-location)."""
        self.applied = Applied(source, version, time.time(), phy2log)
