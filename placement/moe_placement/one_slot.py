"""Placement when every GPU holds one slot (e.g. 256 experts + 32 redundant on 288 GPUs).

Then a GPU's load is simply its expert's load divided by that expert's copies: planning
means choosing the copy counts (which experts get the redundant slots), and, given the
current placement, which GPUs switch expert. Both are done here without any packing.
"""

from __future__ import annotations

import numpy as np

from .layout import FloatArray, IntArray

MIN_GAIN = 1e-5  # relative drop of the expected per-step peak below which a switch is skipped


def keep_positions(new: IntArray, old: IntArray) -> IntArray:
    """Rows of one-slot GPUs: reorder ``new`` [B, G] so that as many GPUs as possible keep their expert.

    Optimal: the r-th copy of expert e in ``new`` goes where the r-th copy of e was.
    """
    rows, size = new.shape
    out = np.full_like(new, -1)
    order_new = np.argsort(new, axis=1, kind="stable")
    order_old = np.argsort(old, axis=1, kind="stable")
    key_new = _occurrence_key(np.take_along_axis(new, order_new, axis=1), size)
    key_old = _occurrence_key(np.take_along_axis(old, order_old, axis=1), size)
    for r in range(rows):
        _, i_new, i_old = np.intersect1d(key_new[r], key_old[r], assume_unique=True, return_indices=True)
        out[r, order_old[r, i_old]] = new[r, order_new[r, i_new]]
        rest_new = np.delete(order_new[r], i_new)
        free = np.flatnonzero(out[r] == -1)
        out[r, free] = new[r, rest_new]
    return out


def _occurrence_key(sorted_ids: IntArray, size: int) -> IntArray:
    """For ids sorted per row, id * size + occurrence index (0 for the first copy, 1 for the next...)."""
    first = np.ones_like(sorted_ids, dtype=bool)
    first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    pos = np.broadcast_to(np.arange(sorted_ids.shape[1]), sorted_ids.shape)
    start = np.maximum.accumulate(np.where(first, pos, 0), axis=1)
    out: IntArray = sorted_ids * size + (pos - start)
    return out


def exchange_copies(state: IntArray, scenarios: FloatArray, budget: int | None, domain: IntArray) -> IntArray:
    """Move copies between experts, one GPU at a time, where it lowers the expected per-step peak.

    state [B, G] expert per GPU; scenarios [B, K, E]; domain [G] conflict domain of each GPU
    (the switched GPU must not share a domain with a copy of its new expert). Each switch
    moves one slot; rows take turns (best relative gain first) until no switch pays or the
    budget is spent.
    """
    rows, size = state.shape
    num_experts = scenarios.shape[2]
    state = state.copy()
    counts = np.zeros((rows, num_experts), dtype=np.int64)
    np.add.at(counts, (np.arange(rows)[:, None], state), 1)
    left = np.inf if budget is None else float(budget)
    active = np.ones(rows, dtype=bool)
    for _ in range(size):
        if not active.any() or left <= 0:
            break
        idx = np.flatnonzero(active)
        gain, give, take = _best_exchange(scenarios[idx], counts[idx])
        ok = gain > MIN_GAIN
        active[idx[~ok]] = False
        for k in np.argsort(-gain, kind="stable"):
            if not ok[k] or left <= 0:
                continue
            r = idx[k]
            donors = np.flatnonzero(state[r] == give[k])
            clash = np.isin(domain[donors], domain[state[r] == take[k]])
            if clash.all():
                active[r] = False
                continue
            gpu = int(donors[~clash][-1])  # the donor's last copy outside the taker's domains
            state[r, gpu] = take[k]
            counts[r, give[k]] -= 1
            counts[r, take[k]] += 1
            left -= 1
    return state


def _best_exchange(scen: FloatArray, counts: IntArray) -> tuple[FloatArray, IntArray, IntArray]:
    """Per row: relative gain of moving one copy from ``give`` to ``take``, judged on scenarios."""
    n, num_scen, num_experts = scen.shape
    per_copy = scen / counts[:, None, :]
    peak = per_copy.max(axis=2)  # [n, K]
    current = peak.mean(axis=1)
    # taking a copy away from x raises x's per-copy load; adding one to y lowers y's
    raised = np.where((counts > 1)[:, None, :], scen / np.maximum(counts - 1, 1)[:, None, :], np.inf)
    lowered = scen / (counts + 1)[:, None, :]
    # candidates: y among the experts that are the peak in some scenario; x any expert with spare copies
    top = np.argmax(per_copy, axis=2)  # [n, K]
    others = np.sort(per_copy, axis=2)  # to get the peak without y
    second = others[:, :, -2] if num_experts > 1 else np.zeros((n, num_scen))
    best_gain = np.full(n, -np.inf)
    best_give = np.zeros(n, dtype=np.int64)
    best_take = np.zeros(n, dtype=np.int64)
    for j in range(num_scen):  # candidate y: scenario j's peak expert
        y = top[:, j]
        y_low = np.take_along_axis(lowered, y[:, None, None].repeat(num_scen, axis=1), axis=2)[
            ..., 0
        ]  # [n, K]
        y_is_peak = top == y[:, None]
        peak_without_y = np.where(y_is_peak, np.maximum(second, y_low), peak)  # [n, K]
        # new peak if x gives a copy: max(peak_without_y, x raised), x != y
        after = np.maximum(peak_without_y[:, :, None], raised).mean(axis=1)  # [n, E]
        after[np.arange(n), y] = np.inf
        x = np.argmin(after, axis=1)
        gain = (current - after[np.arange(n), x]) / current
        better = gain > best_gain
        best_gain = np.where(better, gain, best_gain)
        best_give = np.where(better, x, best_give)
        best_take = np.where(better, y, best_take)
    return best_gain, best_give, best_take
