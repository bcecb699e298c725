"""Put copies (items) onto GPUs with a fixed number of slots each, batched over rows.

Construction is DeepSeek's longest-processing-time greedy with one change: two copies of
one expert never share a conflict domain (a GPU, or a node where static dispatch needs it),
because a second copy there adds no capacity. It is then improved by pairwise swaps
between the busiest GPU and any other GPU, which removes most of the slack greedy leaves:
first on the forecast mean (cheap), then on scenarios (mean over scenarios of the busiest
GPU), which hedges: it pairs experts whose errors offset each other, e.g. experts hot in
different traffic domains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import FloatArray, IntArray

FOCUS_TRIES = 3  # bottleneck GPUs tried per scenario-refinement step before a row stops
PARTNER_GPUS = 24  # swap partners for the scenario refinement: copies on the GPUs lightest on average


@dataclass(frozen=True)
class Bins:
    """GPUs of a row: ``slots`` each; ``domain`` [G] is the conflict domain of each GPU."""

    num_gpus: int
    slots: int
    domain: IntArray

    @property
    def num_domains(self) -> int:
        return int(self.domain.max()) + 1


def lpt(weight: FloatArray, expert: IntArray, num_experts: int, bins: Bins) -> IntArray:
    """Heaviest copy first onto the lightest GPU with room and no copy of it in its domain.

    weight, expert [B, I] -> layout [B, G, S] of item indices.
    """
    rows, num_items = weight.shape
    if bins.slots == 1:
        return _one_slot_layout(weight, expert, bins)
    order = np.argsort(-weight, axis=1, kind="stable")
    gpu_load = np.zeros((rows, bins.num_gpus))
    fill = np.zeros((rows, bins.num_gpus), dtype=np.int64)
    layout = np.full((rows, bins.num_gpus, bins.slots), -1, dtype=np.int64)
    present = np.zeros((rows, bins.num_domains * num_experts), dtype=bool)
    dom_base = (bins.domain * num_experts)[None, :]
    row_ids = np.arange(rows)
    full = np.inf
    sorted_w = np.take_along_axis(weight, order, axis=1)
    sorted_e = np.take_along_axis(expert, order, axis=1)
    for step in range(num_items):
        e = sorted_e[:, step]
        clash = np.take_along_axis(present, dom_base + e[:, None], axis=1)
        key = np.where(clash, gpu_load + 1e300, gpu_load)  # clash only if nothing else has room
        key[fill >= bins.slots] = full
        gpu = np.argmin(key, axis=1)
        layout[row_ids, gpu, fill[row_ids, gpu]] = order[:, step]
        fill[row_ids, gpu] += 1
        gpu_load[row_ids, gpu] += sorted_w[:, step]
        present[row_ids, bins.domain[gpu] * num_experts + e] = True
    return layout


def _one_slot_layout(weight: FloatArray, expert: IntArray, bins: Bins) -> IntArray:
    """One slot per GPU: balance is fixed by the copy counts; only keep copies apart.

    Items of one expert are adjacent (sorted by expert), and consecutive items go to
    consecutive conflict domains, so copies of an expert land in different domains.
    """
    rows, num_items = weight.shape
    order = np.argsort(expert, axis=1, kind="stable")
    domains = bins.num_domains
    per_domain = bins.num_gpus // domains
    # GPU for position i: domain i % D, the (i // D)-th GPU of that domain
    by_domain = np.argsort(bins.domain, kind="stable").reshape(domains, per_domain)
    pos = np.arange(num_items)
    gpu_for_pos = by_domain[pos % domains, pos // domains]
    layout = np.empty((rows, bins.num_gpus, 1), dtype=np.int64)
    layout[:, gpu_for_pos, 0] = order
    return layout


def gpu_totals(weight: FloatArray, layout: IntArray) -> FloatArray:
    """Load per GPU [B, G] of a layout [B, G, S] for item weights [B, I]."""
    rows, num_gpus, slots = layout.shape
    per_slot = np.take_along_axis(weight, layout.reshape(rows, -1), axis=1)
    out: FloatArray = per_slot.reshape(rows, num_gpus, slots).sum(axis=2)
    return out


def refine(
    weight: FloatArray,
    expert: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    max_iter: int | None = None,
) -> IntArray:
    """Best-improvement swaps between the busiest GPU and any other GPU, until none helps."""
    rows, num_gpus, slots = layout.shape
    num_items = weight.shape[1]
    if num_gpus < 2 or rows == 0 or slots == 1:
        return layout  # with one slot per GPU a swap never changes the loads
    layout = layout.copy()
    gpu_of = np.empty((rows, num_items), dtype=np.int64)
    np.put_along_axis(
        gpu_of, layout.reshape(rows, -1), np.repeat(np.arange(num_gpus), slots)[None].repeat(rows, 0), axis=1
    )
    loads = gpu_totals(weight, layout)
    present = np.zeros((rows, bins.num_domains * num_experts), dtype=np.int64)
    np.add.at(present, (np.arange(rows)[:, None], bins.domain[gpu_of] * num_experts + expert), 1)
    active = np.arange(rows)
    limit = max_iter if max_iter is not None else 4 * num_gpus + 20
    for _ in range(limit):
        if active.size == 0:
            break
        improved = _swap_step(weight, expert, num_experts, bins, layout, gpu_of, loads, present, active)
        active = active[improved]
    return layout


def _swap_step(
    weight: FloatArray,
    expert: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    gpu_of: IntArray,
    loads: FloatArray,
    present: IntArray,
    rows: IntArray,
) -> np.ndarray:
    """One best swap per active row, in place. Returns a mask of rows that improved."""
    n = rows.size
    local = np.arange(n)
    load = loads[rows]
    focus = np.argmax(load, axis=1)
    peak = load[local, focus]
    a_items = layout[rows, focus]  # [n, S]
    wa = weight[rows[:, None], a_items]
    wb = weight[rows]  # [n, I]
    partner = gpu_of[rows]
    delta = wa[:, :, None] - wb[:, None, :]  # load leaving the focus GPU
    partner_load = np.take_along_axis(load, partner, axis=1)
    after = np.maximum(peak[:, None, None] - delta, partner_load[:, None, :] + delta)
    ea = expert[rows[:, None], a_items]
    eb = expert[rows]
    dom_f = bins.domain[focus]
    dom_p = bins.domain[partner]
    pr = present[rows]
    a_fits = pr[local[:, None, None], dom_p[:, None, :] * num_experts + ea[:, :, None]] == 0
    b_fits = pr[local[:, None], (dom_f * num_experts)[:, None] + eb] == 0
    valid = (delta > 0) & (partner != focus[:, None])[:, None, :] & (ea[:, :, None] != eb[:, None, :])
    valid &= (dom_p == dom_f[:, None])[:, None, :] | (a_fits & b_fits[:, None, :])
    after = np.where(valid, after, np.inf).reshape(n, -1)
    best = np.argmin(after, axis=1)
    improved: np.ndarray = after[local, best] < peak * (1 - 1e-12)
    sel = local[improved]
    if sel.size:
        r = rows[sel]
        s_idx, b_item = np.divmod(best[sel], weight.shape[1])
        a_item = a_items[sel, s_idx]
        f = focus[sel]
        h = gpu_of[r, b_item]
        pos_b = np.argmax(layout[r, h] == b_item[:, None], axis=1)
        layout[r, f, s_idx] = b_item
        layout[r, h, pos_b] = a_item
        gpu_of[r, b_item] = f
        gpu_of[r, a_item] = h
        d = weight[r, a_item] - weight[r, b_item]
        loads[r, f] -= d
        loads[r, h] += d
        e_a, e_b = expert[r, a_item], expert[r, b_item]
        np.add.at(present, (r, bins.domain[f] * num_experts + e_a), -1)
        np.add.at(present, (r, bins.domain[h] * num_experts + e_a), 1)
        np.add.at(present, (r, bins.domain[h] * num_experts + e_b), -1)
        np.add.at(present, (r, bins.domain[f] * num_experts + e_b), 1)
    return improved


def refine_scenarios(
    load: FloatArray,
    expert: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    max_iter: int | None = None,
) -> IntArray:
    """Swaps that lower the mean over scenarios of the busiest GPU. load [B, K, I] per scenario."""
    rows, num_gpus, slots = layout.shape
    num_items = load.shape[2]
    if num_gpus < 2 or rows == 0 or slots == 1 or load.shape[1] < 2:
        return layout
    layout = layout.copy()
    gpu_of = np.empty((rows, num_items), dtype=np.int64)
    np.put_along_axis(
        gpu_of, layout.reshape(rows, -1), np.repeat(np.arange(num_gpus), slots)[None].repeat(rows, 0), axis=1
    )
    flat = np.broadcast_to(layout.reshape(rows, 1, -1), (rows, load.shape[1], num_gpus * slots))
    loads = np.take_along_axis(load, flat, axis=2).reshape(rows, -1, num_gpus, slots).sum(axis=3)  # [B, K, G]
    present = np.zeros((rows, bins.num_domains * num_experts), dtype=np.int64)
    np.add.at(present, (np.arange(rows)[:, None], bins.domain[gpu_of] * num_experts + expert), 1)
    active = np.arange(rows)
    limit = max_iter if max_iter is not None else 2 * num_gpus + 20
    for _ in range(limit):
        if active.size == 0:
            break
        improved = np.zeros(active.size, dtype=bool)
        for rank in range(FOCUS_TRIES):
            todo = ~improved
            if not todo.any():
                break
            improved[todo] = _scenario_swap_step(
                load, expert, num_experts, bins, layout, gpu_of, loads, present, active[todo], rank
            )
        active = active[improved]
    return layout


def _scenario_swap_step(
    load_all: FloatArray,
    expert: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    gpu_of: IntArray,
    loads: FloatArray,
    present: IntArray,
    rows: IntArray,
    rank: int = 0,
) -> np.ndarray:
    """One best swap per active row against the GPU that is the bottleneck ``rank``-th most often."""
    n = rows.size
    local = np.arange(n)
    z = loads[rows]  # [n, K, G]
    num_scen, num_gpus = z.shape[1], z.shape[2]
    current = z.max(axis=2).mean(axis=1)
    freq = np.zeros((n, num_gpus))
    np.add.at(freq, (np.repeat(local, num_scen), z.argmax(axis=2).ravel()), 1.0)
    mean = z.mean(axis=1)
    score = freq + 1e-3 * mean / np.maximum(mean.max(axis=1, keepdims=True), 1e-300)
    focus = np.argsort(-score, axis=1, kind="stable")[:, min(rank, num_gpus - 1)]
    # per scenario, the largest load outside {focus, partner}: from the top three GPUs
    top = np.argsort(-z, axis=2)[:, :, :3]
    top_val = np.take_along_axis(z, top, axis=2)
    if num_gpus < 3:
        top = np.concatenate([top, np.full((n, num_scen, 3 - num_gpus), -1)], axis=2)
        top_val = np.concatenate([top_val, np.full((n, num_scen, 3 - num_gpus), -np.inf)], axis=2)
    # partners: the copies on the GPUs with the most headroom on average (all when few GPUs)
    a_items = layout[rows, focus]  # [n, S]
    if num_gpus > PARTNER_GPUS:
        light = np.argsort(mean, axis=1, kind="stable")[:, :PARTNER_GPUS]
        light = np.where(
            light == focus[:, None],
            np.argsort(mean, axis=1, kind="stable")[:, PARTNER_GPUS : PARTNER_GPUS + 1],
            light,
        )
        cand = layout[rows[:, None], light].reshape(n, -1)  # [n, M*S] item ids
    else:
        cand = np.broadcast_to(np.arange(load_all.shape[2]), (n, load_all.shape[2]))
    partner = np.take_along_axis(gpu_of[rows], cand, axis=1)  # [n, C]
    load = np.take_along_axis(
        load_all[rows], np.broadcast_to(cand[:, None, :], (n, num_scen, cand.shape[1])), axis=2
    )
    za = np.take_along_axis(
        load_all[rows], np.broadcast_to(a_items[:, None, :], (n, num_scen, a_items.shape[1])), axis=2
    )
    excl = (top != focus[:, None, None])[:, :, None, :] & (top[:, :, None, :] != partner[:, None, :, None])
    other = np.where(
        excl[..., 0],
        top_val[:, :, None, 0],
        np.where(excl[..., 1], top_val[:, :, None, 1], top_val[:, :, None, 2]),
    )  # [n, K, I]
    z_focus = z[local, :, focus]
    z_partner = np.take_along_axis(z, np.broadcast_to(partner[:, None, :], load.shape), axis=2)
    delta = load[:, :, None, :] - za[:, :, :, None]  # [n, K, S, I]: b into the focus GPU, a out
    after = np.maximum(
        np.maximum(z_focus[:, :, None, None] + delta, z_partner[:, :, None, :] - delta), other[:, :, None, :]
    )
    cost = after.mean(axis=1)  # [n, S, I]
    ea = expert[rows[:, None], a_items]
    eb = np.take_along_axis(expert[rows], cand, axis=1)
    dom_f = bins.domain[focus]
    dom_p = bins.domain[partner]
    pr = present[rows]
    a_fits = pr[local[:, None, None], dom_p[:, None, :] * num_experts + ea[:, :, None]] == 0
    b_fits = pr[local[:, None], (dom_f * num_experts)[:, None] + eb] == 0
    valid = (partner != focus[:, None])[:, None, :] & (ea[:, :, None] != eb[:, None, :])
    valid &= (dom_p == dom_f[:, None])[:, None, :] | (a_fits & b_fits[:, None, :])
    cost = np.where(valid, cost, np.inf).reshape(n, -1)
    best = np.argmin(cost, axis=1)
    improved: np.ndarray = cost[local, best] < current * (1 - 1e-9)
    sel = local[improved]
    if sel.size:
        r = rows[sel]
        s_idx, c_idx = np.divmod(best[sel], cand.shape[1])
        b_item = cand[sel, c_idx]
        a_item = a_items[sel, s_idx]
        f = focus[sel]
        h = gpu_of[r, b_item]
        pos_b = np.argmax(layout[r, h] == b_item[:, None], axis=1)
        layout[r, f, s_idx] = b_item
        layout[r, h, pos_b] = a_item
        gpu_of[r, b_item] = f
        gpu_of[r, a_item] = h
        d = load_all[r, :, a_item] - load_all[r, :, b_item]  # [m, K]
        loads[r, :, f] -= d
        loads[r, :, h] += d
        e_a, e_b = expert[r, a_item], expert[r, b_item]
        np.add.at(present, (r, bins.domain[f] * num_experts + e_a), -1)
        np.add.at(present, (r, bins.domain[h] * num_experts + e_a), 1)
        np.add.at(present, (r, bins.domain[h] * num_experts + e_b), -1)
        np.add.at(present, (r, bins.domain[f] * num_experts + e_b), 1)
    return improved
