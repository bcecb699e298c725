"""Load windows from the runtimes' /v1/windows answers, and a bounded in-memory history of them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Window:
    """One instance's per-expert token counts [layers, experts] over one engine rebalance period."""

    instance: str
    seq: int
    ended_at: float
    counts: FloatArray
    restored: bool = False  # an aggregated bucket from before an operator restart: plans, never scores


def parse_windows(instance: str, answer: dict[str, Any], shape: tuple[int, int]) -> list[Window]:
    """Windows of one /v1/windows answer; ones of another shape (other model, no counts) are dropped."""
    out: list[Window] = []
    for w in answer.get("windows") or []:
        counts = np.asarray(w.get("counts") or [], dtype=np.float64)
        if counts.shape != shape or not np.all(np.isfinite(counts)) or counts.min(initial=0.0) < 0:
            continue
        out.append(Window(instance, int(w["seq"]), float(w.get("ended_at") or 0.0), counts))
    return out


@dataclass
class History:
    """A pool's windows from every instance, newest last, bounded by age (spec.eplb.history)."""

    windows: deque[Window] = field(default_factory=deque)
    cursors: dict[str, int] = field(default_factory=dict)  # instance -> last seq seen

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
        return added

    def restore(self, buckets: list[Window], cursors: dict[str, int]) -> None:
        """Seed an empty history after an operator restart (keeps anything already collected)."""
        for instance, seq in cursors.items():
            self.cursors.setdefault(instance, seq)
        self.windows = deque(sorted([*buckets, *self.windows], key=lambda w: w.ended_at))

    def forget_instance(self, instance: str) -> None:
        """A restarted runtime numbers its windows from 1 again: read it from the start."""
        self.cursors.pop(instance, None)

    def prune(self, now: float, max_age_s: float) -> None:
        while self.windows and self.windows[0].ended_at < now - max_age_s:
            self.windows.popleft()
