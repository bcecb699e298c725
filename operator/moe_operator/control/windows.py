"""Load windows from the runtimes' /v1/windows answers, and a bounded in-memory history of them."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
MAX_CLOCK_SKEW_S = 300.0  # a window may end this far ahead of the operator's clock
MAX_SEQ = 2**53  # window numbers stay exact in JSON
MAX_HISTORY_BYTES = 64 * 2**20  # per pool: about 500 DeepSeek-V3 windows (61 x 256 float64)


@dataclass(frozen=True)
class Window:
    """One instance's per-expert token counts [layers, experts] over one engine rebalance period."""

    instance: str
    seq: int
    ended_at: float
    counts: FloatArray
    restored: bool = False  # an aggregated bucket from before an operator restart: plans, never scores


def parse_windows(
    instance: str, answer: dict[str, Any], shape: tuple[int, int], now: float | None = None
) -> list[Window]:
    """Windows of one /v1/windows answer. Dropped: another shape (other model, no counts), counts
    that are not finite and non-negative, numbers out of range, and windows ending in the future
    (they would stay "fresh" forever and never age out of the history)."""
    now = time.time() if now is None else now
    out: list[Window] = []
    raw = answer.get("windows")
    for w in raw if isinstance(raw, list) else []:
        if not isinstance(w, dict):
            continue
        seq, ended = w.get("seq"), w.get("ended_at") or 0.0
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
            continue
        if not isinstance(ended, int | float) or not math.isfinite(ended) or ended > now + MAX_CLOCK_SKEW_S:
            continue
        try:
            counts = np.asarray(w.get("counts") or [], dtype=np.float64)
        except (ValueError, TypeError):
            continue
        if counts.shape != shape or not np.all(np.isfinite(counts)) or counts.min(initial=0.0) < 0:
            continue
        out.append(Window(instance, seq, float(ended), counts))
    return out


@dataclass
class History:
    """A pool's windows from every instance, newest last, bounded by age (spec.eplb.history)."""

    windows: deque[Window] = field(default_factory=deque)
    cursors: dict[str, int] = field(default_factory=dict)  # instance -> last seq seen
    max_bytes: int = MAX_HISTORY_BYTES  # the oldest windows go first beyond this

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
        self._bound()
        return added

    def _bound(self) -> None:
        total = sum(w.counts.nbytes for w in self.windows)
        while self.windows and total > self.max_bytes:
            total -= self.windows.popleft().counts.nbytes

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
