"""Load windows from the runtimes' /v1/windows answers, and a bounded in-memory history of them."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
MAX_CLOCK_SKEW_S = 300.0  # a window may end this far ahead of the operator's clock
MAX_SEQ = 2**53  # window numbers stay exact in JSON
MAX_HISTORY_BYTES = 64 * 2**20  # per pool at least: about 500 DeepSeek-V3 windows (61 x 256 float64)
# and per instance the pool holds windows of: 8 V3 windows (1 MB) and one set of step samples
# (1 MB as uint16), with room; a pool of hundreds of instances keeps every one's own history
MAX_BYTES_PER_INSTANCE = 4 * 2**20
MAX_WINDOWS_PER_ANSWER = 64  # a runtime's ring (moe_runtime.sidecar.state.DEFAULT_RING)
MAX_STEP_SAMPLES = 32  # what the runtime sends (moe_runtime.eplb_hook.STEP_SAMPLES): 1 MB per instance at V3


def instance_of(key: str) -> str:
    """The instance a history key ("pod/uid") belongs to: the leader pod's name, which a restarted
    group keeps (its uid changes), so its windows from before the restart stay its own."""
    return key.split("/", 1)[0]


def newest(w: Window) -> tuple[float, int]:
    """How windows of one instance are ordered: by end, then number (one rule for every reader)."""
    return (w.ended_at, w.seq)


@dataclass(frozen=True)
class Window:
    """One instance's per-expert token counts [layers, experts] over one engine rebalance period,
    and up to MAX_STEP_SAMPLES single passes of it [k, layers, experts], oldest first (per-pass
    counts are integers: kept exact as uint16, or uint32, a quarter or half of float64's memory;
    anything else as float32), held on each instance's newest window only
    (apart from the history's byte bound: at most one set per instance)."""

    instance: str
    seq: int
    ended_at: float
    counts: FloatArray
    restored: bool = False  # an aggregated bucket from before an operator restart: plans, never scores
    steps: npt.NDArray[Any] | None = None


def parse_windows(
    instance: str, answer: dict[str, Any], shape: tuple[int, int], now: float | None = None
) -> list[Window]:
    """Windows of one /v1/windows answer, JSON or binary (moe_contract.windows_wire.decode gives
    the same dictionary with arrays, judged here by the same rules). Dropped: another shape (other
    model, no counts), counts that are not finite and non-negative, numbers out of range, and
    windows ending in the future (they would stay "fresh" forever and never age out of the
    history). Step samples are read from the newest window alone (the only one the planner uses).
    The arrays kept are copies: a decoded answer's are views of its whole body."""
    now = time.time() if now is None else now
    out: list[Window] = []
    sampled: list[Any] = []  # each kept window's raw step samples
    raw = answer.get("windows")
    for w in raw if isinstance(raw, list) else []:
        if not isinstance(w, dict):
            continue
        seq, ended = w.get("seq"), w.get("ended_at") or 0.0
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
            continue
        if not isinstance(ended, int | float) or not -MAX_SEQ < ended <= now + MAX_CLOCK_SKEW_S:
            continue  # NaN fails both comparisons; an int too large for a float never reaches isfinite
        raw_counts = w.get("counts")
        if isinstance(raw_counts, np.ndarray) and raw_counts.shape != shape:
            continue  # a binary answer's: refused before it is copied (4x as float64)
        try:
            counts = np.array([] if raw_counts is None else raw_counts, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            continue
        if counts.shape != shape or not np.all(np.isfinite(counts)) or counts.min(initial=0.0) < 0:
            continue
        out.append(Window(instance, seq, float(ended), counts))
        sampled.append(w.get("steps"))
    if len(out) > MAX_WINDOWS_PER_ANSWER:  # a runtime's ring holds 64: the newest of them
        order = sorted(range(len(out)), key=lambda i: newest(out[i]))[-MAX_WINDOWS_PER_ANSWER:]
        out, sampled = [out[i] for i in sorted(order)], [sampled[i] for i in sorted(order)]
    if out:
        last = max(range(len(out)), key=lambda i: newest(out[i]))
        out[last] = replace(out[last], steps=parse_steps(sampled[last], out[last].counts))
    return out


def parse_steps(raw: Any, counts: FloatArray) -> npt.NDArray[Any] | None:
    """A window's step samples, or None (the window still counts) when absent or not samples of
    it: wrong shape, more than MAX_STEP_SAMPLES, not finite and non-negative, or summing to more
    than the window holds for some expert (a pass cannot route more than its window)."""
    if not isinstance(raw, list | np.ndarray) or not 0 < len(raw) <= MAX_STEP_SAMPLES:
        return None
    try:
        steps = np.asarray(raw, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        return None
    if steps.shape[1:] != counts.shape or not np.all(np.isfinite(steps)) or steps.min(initial=0.0) < 0:
        return None
    kept = compact(steps)  # checked as stored: past float32's range is inf, past any window
    if np.any(kept.sum(axis=0, dtype=np.float64) > counts):
        return None
    return kept


def compact(steps: FloatArray) -> npt.NDArray[Any]:
    """Finite, non-negative samples in the narrowest exact type: whole numbers up to 2^16 - 1 as
    uint16 (today's batch sizes), up to 2^32 - 1 as uint32, anything else as float32."""
    top = float(steps.max(initial=0.0))
    if top < 2**32 and np.array_equal(steps, np.floor(steps)):
        return steps.astype(np.uint16 if top < 2**16 else np.uint32)
    with np.errstate(over="ignore"):  # past float32's range: inf, which no window holds (refused)
        return steps.astype(np.float32)


def _nbytes(w: Window) -> int:
    return int(w.counts.nbytes + (0 if w.steps is None else w.steps.nbytes))


@dataclass
class History:
    """A pool's windows from every instance, newest last, bounded by age (spec.eplb.history)."""

    windows: deque[Window] = field(default_factory=deque)
    cursors: dict[str, int] = field(default_factory=dict)  # instance -> last seq seen
    max_bytes: int = MAX_HISTORY_BYTES  # the oldest windows go first beyond this, or beyond
    per_instance: int = MAX_BYTES_PER_INSTANCE  # this times the instances held, if that is more

    def add(self, new: list[Window]) -> int:
        """Keep windows not seen yet (by seq per instance); returns how many were new."""
        added = 0
        for w in sorted(new, key=lambda w: (w.ended_at, w.seq)):
            last = self.cursors.get(w.instance)
            if last is not None and w.seq <= last:
                continue
            self.cursors[w.instance] = w.seq
            self.windows.append(w)
            added += 1
        self.windows = deque(sorted(self.windows, key=lambda w: w.ended_at))
        self._newest_steps_only()
        self._bound()
        return added

    def _newest_steps_only(self) -> None:
        """Step samples stay on each instance's newest window that has them (the planner reads no
        others): a pool's history holds at most one set per instance."""
        keep: dict[str, Window] = {}
        for w in self.windows:
            name = instance_of(w.instance)  # a restarted leader's old samples go too
            if w.steps is not None and (name not in keep or newest(w) > newest(keep[name])):
                keep[name] = w
        if sum(w.steps is not None for w in self.windows) > len(keep):
            self.windows = deque(
                w if w.steps is None or keep[instance_of(w.instance)] is w else replace(w, steps=None)
                for w in self.windows
            )

    def _bound(self) -> None:
        """Counts and step samples both count; the allowance grows with the instances held, so a
        pool of hundreds keeps each one's own windows instead of a few of the newest. Over it, an
        instance past its own share loses its own oldest windows first (never its newest): one
        runtime's flood of windows cannot push the other instances' out."""
        sizes: dict[str, int] = {}
        newest_of: dict[str, Window] = {}
        for w in self.windows:
            name = instance_of(w.instance)
            sizes[name] = sizes.get(name, 0) + _nbytes(w)
            if name not in newest_of or newest(w) > newest(newest_of[name]):
                newest_of[name] = w
        limit = max(self.max_bytes, len(sizes) * self.per_instance)
        total = sum(sizes.values())
        if total <= limit:
            return
        kept: deque[Window] = deque()
        for w in self.windows:  # oldest first
            name = instance_of(w.instance)
            if total > limit and sizes[name] > self.per_instance and w is not newest_of[name]:
                sizes[name] -= _nbytes(w)
                total -= _nbytes(w)
            else:
                kept.append(w)
        self.windows = kept
        while self.windows and total > limit:
            total -= _nbytes(self.windows.popleft())

    def restore(self, buckets: list[Window], cursors: dict[str, int]) -> None:
        """Seed an empty history after an operator restart (keeps anything already collected)."""
        for instance, seq in cursors.items():
            self.cursors.setdefault(instance, seq)
        self.windows = deque(sorted([*buckets, *self.windows], key=lambda w: w.ended_at))
        self._bound()

    def forget_instance(self, instance: str) -> None:
        """A restarted runtime numbers its windows from 1 again: read it from the start."""
        self.cursors.pop(instance, None)

    def prune(self, now: float, max_age_s: float) -> None:
        while self.windows and self.windows[0].ended_at < now - max_age_s:
            self.windows.popleft()
