"""The plugin's decision, in numpy: which expert map the engine applies at a rebalance.

SGLang's EPLB calls ``rebalance_experts`` every N forward passes with the window's
per-expert counts. At that moment this module (on rank 0):

1. spools the window for the sidecar (never blocking the engine on it);
2. picks the map: the operator's placement when it is fresh and fits the engine's
   shapes, else the project's planner on the engine's window, else ``None`` meaning
   "SGLang's own algorithm";
3. after the engine applied it, records what was applied and the counters the sidecar
   exports as metrics.

The torch adapter (``sglang_plugin``) and the replay engine both call this module, so
the GPU-less runs exercise the same decision code as the engine.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from moe_placement.maps import Dispatch, IntArray, PlacementError, validate_map
from moe_runtime import exchange

log = logging.getLogger("moe_runtime.eplb_hook")

Source = exchange.DecisionSource
EplbMode = Literal["operator", "engine", "static", "off"]

ENV_MODE = "MOE_EPLB_MODE"
ENV_PLACEMENT_FILE = "MOE_PLACEMENT_FILE"
ENV_MAX_AGE = "MOE_PLACEMENT_MAX_AGE_SECONDS"
ENV_DISPATCH = "MOE_EP_DISPATCH"
ENV_PLANNER = "MOE_EPLB_PLANNER"
ENV_INSTANCE = "MOE_INSTANCE"
DEFAULT_MAX_AGE = 1800.0


@dataclass(frozen=True)
class HookSettings:
    """What the launcher tells the plugin through the engine's environment."""

    mode: EplbMode = "operator"
    state_dir: Path = Path(exchange.DEFAULT_STATE_DIR)
    placement_file: Path | None = None  # the operator's ConfigMap, mounted
    max_age_s: float = DEFAULT_MAX_AGE
    dispatch: Dispatch = "static"
    use_planner: bool = True
    instance: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookSettings:
        env = os.environ if env is None else env
        mode = env.get(ENV_MODE, "operator")
        if mode not in ("operator", "engine", "static", "off"):
            log.warning("unknown %s=%r, using 'operator'", ENV_MODE, mode)
            mode = "operator"
        dispatch = env.get(ENV_DISPATCH, "static")
        placement = env.get(ENV_PLACEMENT_FILE)
        try:
            max_age = float(env.get(ENV_MAX_AGE, DEFAULT_MAX_AGE))
        except ValueError:
            max_age = DEFAULT_MAX_AGE
        return cls(
            mode=cast(EplbMode, mode),
            state_dir=exchange.state_dir(env.get(exchange.STATE_DIR_ENV)),
            placement_file=Path(placement) if placement else None,
            max_age_s=max_age,
            dispatch="dynamic" if dispatch == "dynamic" else "static",
            use_planner=env.get(ENV_PLANNER, "on").lower() not in ("0", "off", "false", "no"),
            instance=env.get(ENV_INSTANCE, ""),
        )


@dataclass(frozen=True)
class EngineShape:
    """The engine's side of the contract: what a map must fit."""

    num_layers: int
    num_logical: int
    num_physical: int
    num_gpus: int
    num_nodes: int = 1
    num_groups: int | None = None

    @property
    def num_redundant(self) -> int:
        return self.num_physical - self.num_logical


@dataclass(frozen=True)
class Decision:
    source: Source
    phy2log: IntArray | None  # None: let SGLang's original algorithm decide
    version: int | None = None
    reason: str = ""
    planner_seconds: float = 0.0


PlanFn = Callable[..., Any]
# the engine's current map, or a function computing it (only the planner needs it)
CurrentMap = IntArray | Callable[[], IntArray | None] | None


def load_planner() -> PlanFn | None:
    """The project's planner, imported lazily: the engine image may lack it or it may be broken."""
    for module in ("moe_placement",):
        try:
            return cast(PlanFn, importlib.import_module(module).plan)
        except Exception as exc:  # ImportError, AttributeError, or a planner module failing at import
            log.debug("project planner not in %s: %s", module, exc)
    return None


class BackgroundWriter:
    """Runs the plugin's file writes off the engine's rebalance path, in order, on one thread.

    Bounded: when the sidecar's disk is slow and writes pile up, new ones are dropped
    (and counted) rather than queued without limit.
    """

    def __init__(self, limit: int = 16) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=limit)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="moe-runtime-writer", daemon=True)
                self._thread.start()
                atexit.register(self.flush, 2.0)  # do not lose the last window at exit
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every submitted write ran (tests, shutdown)."""
        if self._thread is None or not self._thread.is_alive():
            return
        done = threading.Event()
        try:
            self._queue.put(done.set, timeout=timeout)
        except queue.Full:
            return
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # jobs count their own errors; this is a last resort
                log.warning("moe-runtime EPLB plugin: background write failed: %s", exc)


@dataclass
class HookState:
    """Per-process counters and cached files; the sidecar reads them from plugin-status.json."""

    settings: HookSettings
    decisions: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    windows: Counter[str] = field(default_factory=Counter)  # by exchange.WINDOW_SAMPLES
    started_at: float = field(default_factory=time.time)
    last_window_end: float | None = None
    last: dict[str, Any] = field(default_factory=dict)
    planner: Callable[[], PlanFn | None] = load_planner
    writer: BackgroundWriter | None = field(default_factory=BackgroundWriter)  # None: write inline
    _files: dict[Path, exchange.CachedPlacementFile] = field(default_factory=dict)

    def write(self, job: Callable[[], None]) -> None:
        if self.writer is None:
            job()
        else:
            self.writer.submit(job)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def placement_files(self) -> list[exchange.CachedPlacementFile]:
        paths = [exchange.placement_path(self.settings.state_dir)]
        if self.settings.placement_file is not None:
            paths.append(self.settings.placement_file)
        out = []
        for path in paths:
            if path not in self._files:
                self._files[path] = exchange.CachedPlacementFile(path)
            out.append(self._files[path])
        return out

    def error(self, stage: exchange.ErrorStage, exc: BaseException | str) -> None:
        self.errors[stage] += 1
        log.warning("moe-runtime EPLB plugin: %s failed: %s", stage, exc)


# ---------------------------------------------------------------- steps


STEP_SAMPLES = 32  # single passes kept per window: the planner hedges on their spread (docs/placement.md)


def sample_positions(
    routed: npt.ArrayLike, next_index: int | None, count: int = STEP_SAMPLES
) -> IntArray | None:
    """Buffer rows of up to ``count`` passes that routed tokens, evenly spaced in time, oldest first.

    SGLang's stat-mode buffer is a ring written at ``next_index`` (its oldest row once it has
    wrapped; a reset zeroes the rows but keeps the index), so time order is the ring read from
    there. None when the index is unknown: out-of-order samples would point the planner's
    newest-level rule at the wrong end of the window."""
    live = np.asarray(routed, dtype=bool)
    if not isinstance(next_index, int) or isinstance(next_index, bool) or count < 1:
        return None
    if live.ndim != 1 or not 0 <= next_index < live.size:
        return None
    order: IntArray = np.roll(np.arange(live.size, dtype=np.int64), -next_index)
    order = order[live[order]]
    if order.size <= count:
        return order if order.size else None
    pick = np.round(np.linspace(order.size - 1, 0, count))[::-1].astype(np.int64)  # the newest always
    return order[pick]


def steps_from_buffer(
    buffer: npt.ArrayLike, next_index: int | None, routed: npt.ArrayLike | None = None
) -> exchange.StepArray | None:
    """The step samples of a [passes, L, E] recorder buffer (see ``sample_positions``);
    ``routed``: its ``exchange.routed_passes``, when the caller has them already."""
    arr = np.asarray(buffer)
    if arr.ndim != 3 or arr.shape[0] == 0:
        return None
    rows = sample_positions(exchange.routed_passes(arr) if routed is None else routed, next_index)
    return None if rows is None else np.asarray(arr[rows], dtype=np.int32)


def window_from_buffer(buffer: npt.ArrayLike) -> tuple[IntArray, int]:
    """Sum SGLang's [passes, L, E] recorder buffer to [L, E]; count passes that routed tokens."""
    arr = np.asarray(buffer)
    if arr.ndim == 2:
        return arr.astype(np.int64), 1
    return arr.sum(axis=0, dtype=np.int64), int(np.count_nonzero(exchange.routed_passes(arr)))


def window_with_steps(
    buffer: npt.ArrayLike, next_index: int | None
) -> tuple[IntArray, int, exchange.StepArray | None]:
    """``window_from_buffer`` and ``steps_from_buffer`` of one [passes, L, E] buffer, its passes read once."""
    arr = np.asarray(buffer)
    if arr.ndim != 3:
        counts, passes = window_from_buffer(arr)
        return counts, passes, None
    routed = exchange.routed_passes(arr)
    steps = steps_from_buffer(arr, next_index, routed)
    return arr.sum(axis=0, dtype=np.int64), int(np.count_nonzero(routed)), steps


def window_samples(passes: int, steps: exchange.StepArray | None) -> exchange.WindowSamples:
    """Which of exchange.WINDOW_SAMPLES a window with these passes and samples counts as."""
    if steps is not None and len(steps):
        return "present"
    return "missing" if passes > 0 else "idle"


def export_window(
    state: HookState,
    counts: IntArray,
    passes: int,
    shape: EngineShape,
    steps: exchange.StepArray | None = None,
) -> None:
    """Spool the window (and its step samples) for the sidecar, in the background; failures are
    counted, never raised."""
    now = time.time()
    started = state.last_window_end if state.last_window_end is not None else state.started_at
    state.last_window_end = now
    state.windows[window_samples(passes, steps)] += 1
    record = exchange.WindowRecord(
        counts=np.array(counts, dtype=np.int64),  # a copy: the caller may reuse its buffer
        passes=passes,
        started_at=started,
        ended_at=now,
        meta={
            "num_physical": shape.num_physical,
            "num_gpus": shape.num_gpus,
            "instance": state.settings.instance,
        },
        steps=None if steps is None else np.array(steps, dtype=np.int32),
    )

    def job() -> None:
        try:
            exchange.write_window(state.settings.state_dir, record)
        except Exception as exc:
            state.error("export", exc)

    state.write(job)


def operator_placement(state: HookState, shape: EngineShape, now: float) -> tuple[Decision | None, str]:
    """The freshest valid operator placement (highest version among fitting, fresh files)."""
    best: Decision | None = None
    reasons = []
    for cached in state.placement_files():
        doc, err = cached.load()
        if err is not None:
            state.error("placement", err)
            reasons.append(err)
            continue
        if doc is None:
            continue
        if doc.age(now) > state.settings.max_age_s:
            reasons.append(f"{cached.path}: version {doc.version} is stale ({doc.age(now):.0f}s old)")
            continue
        try:
            arr = validate_map(
                doc.physical_to_logical_map,
                num_layers=shape.num_layers,
                num_logical=shape.num_logical,
                num_physical=shape.num_physical,
                num_gpus=shape.num_gpus,
            )
        except PlacementError as exc:
            state.error("placement", f"{cached.path}: {exc}")
            reasons.append(f"{cached.path}: {exc}")
            continue
        if best is None or (best.version or 0) < doc.version:
            best = Decision("operator", arr, doc.version, f"operator placement v{doc.version}")
    return best, "; ".join(reasons) or "no operator placement"


def planner_placement(
    state: HookState, counts: IntArray, shape: EngineShape, current: CurrentMap
) -> Decision | None:
    """The project's planner on the engine's own window; None when off, absent or its map is unsafe.
    It gets the window's sum alone: with step samples its search outruns the engine's own
    algorithm's time at EP72 (docs/placement.md, "In-engine fallback budget")."""
    if not state.settings.use_planner:
        return None
    plan = state.planner()
    if plan is None:
        return None
    start = time.perf_counter()
    try:
        result = plan(
            counts.astype(np.float64),
            num_gpus=shape.num_gpus,
            num_nodes=shape.num_nodes,
            num_redundant=shape.num_redundant,
            num_groups=shape.num_groups or 1,
            current=current() if callable(current) else current,
            dispatch=state.settings.dispatch,
        )
        arr = validate_map(
            result.physical_to_logical_map,
            num_layers=shape.num_layers,
            num_logical=shape.num_logical,
            num_physical=shape.num_physical,
            num_gpus=shape.num_gpus,
        )
    except Exception as exc:
        state.error("planner", exc)
        return None
    return Decision("planner", arr, None, "project planner on the engine window", time.perf_counter() - start)


def choose_map(
    state: HookState,
    counts: IntArray,
    shape: EngineShape,
    *,
    current: CurrentMap = None,
    now: float | None = None,
) -> Decision:
    """Operator placement, else planner, else SGLang's original. Never raises."""
    mode = state.settings.mode
    if mode != "operator":
        return Decision("original", None, None, f"eplb mode {mode}: the engine decides")
    try:
        found, why = operator_placement(state, shape, time.time() if now is None else now)
        if found is not None:
            return found
        planned = planner_placement(state, counts, shape, current)
        if planned is not None:
            return Decision(planned.source, planned.phy2log, None, f"{why}; planner", planned.planner_seconds)
        planner = "planner off" if not state.settings.use_planner else "planner unavailable or refused"
        return Decision("original", None, None, f"{why}; {planner}")
    except Exception as exc:  # defensive: the engine must get an answer
        state.error("decide", exc)
        return Decision("original", None, None, f"error: {exc}")


def record_applied(
    state: HookState, decision: Decision, applied: IntArray | None, *, hook_seconds: float
) -> None:
    """Write applied.npz and plugin-status.json for the sidecar (in the background)."""
    now = time.time()
    state.decisions[decision.source] += 1
    state.last = {
        "source": decision.source,
        "version": decision.version,
        "reason": decision.reason,
        "at": now,
        "hook_seconds": hook_seconds,
        "planner_seconds": decision.planner_seconds,
    }
    base = state.settings.state_dir
    meta = {"source": decision.source, "version": decision.version, "applied_at": now}
    status = status_doc(state)

    def job() -> None:
        try:
            if applied is not None:
                exchange.write_applied(base, applied, meta)
        except Exception as exc:
            state.error("status", exc)
        write_status(state, status)

    state.write(job)


def status_doc(state: HookState) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "started_at": state.started_at,
        "decisions": dict(state.decisions),
        "errors": dict(state.errors),
        "windows": dict(state.windows),
        "last": dict(state.last),
        "dropped_writes": state.writer.dropped if state.writer else 0,
    }


def write_status(state: HookState, doc: dict[str, Any] | None = None) -> None:
    try:
        exchange.atomic_write_json(
            exchange.plugin_status_path(state.settings.state_dir), doc or status_doc(state)
        )
    except Exception as exc:
        state.error("status", f"cannot write status: {exc}")


def rebalance_single_process(
    state: HookState,
    counts: IntArray,
    passes: int,
    shape: EngineShape,
    original: Callable[[], IntArray],
    *,
    current: CurrentMap = None,
    steps: exchange.StepArray | None = None,
) -> tuple[Decision, IntArray]:
    """The hook's whole rank-0 path without a process group (replay engine, one-GPU engines).

    Returns the decision and the map to apply; ``original`` is the engine's own algorithm.
    """
    start = time.perf_counter()
    export_window(state, counts, passes, shape, steps)
    decision = choose_map(state, counts, shape, current=current)
    original_seconds = 0.0
    applied = decision.phy2log
    if applied is None:
        t0 = time.perf_counter()
        applied = original()
        original_seconds = time.perf_counter() - t0
    hook_seconds = time.perf_counter() - start - original_seconds - decision.planner_seconds
    record_applied(state, decision, applied, hook_seconds=hook_seconds)
    return decision, applied
