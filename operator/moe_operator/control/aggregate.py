"""Aggregate windows across a pool's instances and over time into the planner's [T, L, E] history."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moe_operator.control.windows import FloatArray, Window

MAX_BUCKETS = 32


def time_buckets(windows: Sequence[Window], bucket_s: float, max_buckets: int = MAX_BUCKETS) -> FloatArray:
    """Sum windows of all instances that end in the same time bucket; [T, L, E], oldest first."""
    return bucketed(windows, bucket_s, max_buckets)[1]


def bucketed(
    windows: Sequence[Window], bucket_s: float, max_buckets: int = MAX_BUCKETS
) -> tuple[list[int], FloatArray]:
    """The bucket keys (end time // bucket_s) and their summed counts [T, L, E], oldest first.

    Instances serve the same traffic mix, so their counts add up; buckets (not window
    sequence numbers) align instances whose rebalance clocks differ. Empty buckets are
    left out; only the newest ``max_buckets`` are kept (the planner's cost grows with T).
    """
    if not windows:
        raise ValueError("no windows to aggregate")
    if bucket_s <= 0:
        raise ValueError(f"bucket_s must be > 0, got {bucket_s}")
    buckets: dict[int, FloatArray] = {}
    for w in windows:
        key = int(w.ended_at // bucket_s)
        if key in buckets:
            buckets[key] = buckets[key] + w.counts
        else:
            buckets[key] = w.counts.copy()
    keys = sorted(buckets)[-max_buckets:]
    return keys, np.stack([buckets[k] for k in keys])


def latest(windows: Sequence[Window]) -> tuple[FloatArray, list[str], tuple[int, int]]:
    """The newest window of each instance, summed: the traffic the current placement is scored on.

    Returns the counts [L, E], the instances used and the (oldest, newest) end times.
    """
    newest: dict[str, Window] = {}
    for w in windows:
        if w.instance not in newest or w.ended_at > newest[w.instance].ended_at:
            newest[w.instance] = w
    if not newest:
        raise ValueError("no windows")
    ws = list(newest.values())
    total = np.sum([w.counts for w in ws], axis=0)
    ends = [w.ended_at for w in ws]
    return total, sorted(newest), (int(min(ends)), int(max(ends)))
