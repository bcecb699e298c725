"""Re-pack the current placement toward the forecast's copy counts, within a move budget.

Local changes (incremental.py) stall on tight layouts: with two slots per GPU almost every
single swap or relabel raises some other GPU to the peak, so the search stops far from a
fresh plan, while the fresh plan itself differs in most slots. This is the middle road:
first relabel the few slots whose experts have more copies than the forecast wants (to
experts that want more), then run the fresh planner's own swap refinement (on the mean,
then on scenarios) starting from what the GPUs hold, for as many swaps as the budget
allows. Every swap lowers the busiest GPU, so the result moves only where it pays.
"""

from __future__ import annotations

import numpy as np

from .layout import FloatArray, IntArray
from .matching import align_slots
from .packing import Bins, refine, refine_scenarios
from .replicate import greedy_counts


def guided_rows(
    state: IntArray,
    scenarios: FloatArray,
    mean: FloatArray,
    bins: Bins,
    budget: int | None,
) -> IntArray:
    """state [B, G, S] row-local expert ids; scenarios [B, K, E]; mean [B, E]; ``budget`` moves per row."""
    rows, num_gpus, slots = state.shape
    num_experts = mean.shape[1]
    flat = state.reshape(rows, -1).copy()
    total = flat.shape[1]
    cap = max(-(-total // num_experts), min(bins.num_domains, total - num_experts + 1))
    target = greedy_counts(mean, total, cap)
    left = np.full(rows, np.inf if budget is None else float(budget))
    for r in range(rows):
        left[r] -= _relabel_to(flat[r], target[r], mean[r], bins, slots, left[r])
    if slots == 1:
        return flat.reshape(state.shape)
    counts = np.zeros((rows, num_experts), dtype=np.int64)
    np.add.at(counts, (np.arange(rows)[:, None], flat), 1)
    layout = np.broadcast_to(np.arange(total).reshape(1, num_gpus, slots), state.shape).copy()
    swaps = int(min(left.min(), 4 * num_gpus + 20) // 2) if budget is not None else None
    if swaps is not None and swaps < 1:
        return flat.reshape(state.shape)
    weight = np.take_along_axis(mean / counts, flat, axis=1)
    layout = refine(weight, flat, num_experts, bins, layout, max_iter=swaps)
    away = _items_away(layout)
    if scenarios.shape[1] > 1:
        per_copy = scenarios / counts[:, None, :]
        load = np.take_along_axis(
            per_copy, np.broadcast_to(flat[:, None, :], (rows, *per_copy.shape[1:2], total)), axis=2
        )
        more = None if swaps is None else max(0, swaps - int(away.max()) // 2)
        if more is None or more > 0:
            layout = refine_scenarios(load, flat, num_experts, bins, layout, max_iter=more)
    out = align_slots(np.take_along_axis(flat, layout.reshape(rows, -1), axis=1).reshape(state.shape), state)
    if budget is not None:  # a swap can be undone later, so count the moves that remain
        over = (out != state).reshape(rows, -1).sum(axis=1) > budget
        out[over] = flat.reshape(state.shape)[over]
    return out


def _items_away(layout: IntArray) -> IntArray:
    """Items away from their starting GPU, per row (each swap so far moved at most two)."""
    rows, num_gpus, slots = layout.shape
    gpu_now = np.repeat(np.arange(num_gpus), slots)[None, :]
    out: IntArray = (layout.reshape(rows, -1) // slots != gpu_now).sum(axis=1)
    return out


def _relabel_to(
    row: IntArray, target: IntArray, mean: FloatArray, bins: Bins, slots: int, budget: float
) -> int:
    """In place: relabel slots of experts above their target count to experts below it. Returns moves."""
    counts = np.bincount(row, minlength=target.size)
    gpu = np.arange(row.size) // slots
    dom = bins.domain[gpu]
    moves = 0
    needy = np.flatnonzero(counts < target)
    # neediest first: the expert whose load per copy is highest at its current count
    for y in needy[np.argsort(-mean[needy] / counts[needy], kind="stable")]:
        while counts[y] < target[y] and moves < budget:
            spare = (counts[row] > target[row]) & ~np.isin(dom, dom[row == y])
            if not spare.any():
                break
            # take the spare copy whose loss raises its expert's per-copy load the least
            cost = np.where(spare, mean[row] / np.maximum(counts[row] - 1, 1), np.inf)
            pos = int(np.argmin(cost))
            counts[row[pos]] -= 1
            row[pos] = y
            counts[y] += 1
            moves += 1
    return moves
