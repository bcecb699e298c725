"""Decide, layer by layer, how far to move from the current placement (each loaded copy costs a transfer).

Options per layer: keep it; repair it within a budget (only when there is a cap: repairs
within a half, one, one and a half and two even shares of the cap); or take the fresh plan
relabelled to share as many slots with it as possible (matching.py).
Repair first relabels spare copies toward the fresh plan's copy counts (one copy loaded
each), then exchanges copies between GPUs on the forecast scenarios (search.py, 0-2 copies
loaded each, fewer when a copy moves on or back home) while its budget lasts. The options are compared on the forecast scenarios
under the real dispatch rule; a layer changes only when its predicted gain clears
``min_layer_gain`` (small gains are not worth the transfers), and all layers together
stay within ``max_moves`` loaded copies: the options that minimise the summed objective
within the cap (``allocate``, exact), so a layer whose drift a copy buys more from takes
copies from one where it buys less.
"""

from __future__ import annotations

import numpy as np

from .forecast import Forecast
from .layout import BoolArray, FloatArray, IntArray, Layout, expert_counts
from .matching import align_slots, assign_max_overlap, match_to_current
from .metrics import gpu_loads, gpu_moves_per_layer, imbalance
from .packing import Bins, lpt
from .search import expected_peak, gpu_scenario_loads, pair_refine
from .solve import item_loads

TIE = 1e-3  # relative objective difference treated as a tie (then fewer moves wins)
REPAIR_SHARES = (0.5, 1.0, 1.5, 2.0)  # repair budgets tried per layer, in even shares of the cap


def expected_imbalance(phy2log: IntArray, fc: Forecast, layout: Layout, dispatch: str) -> FloatArray:
    """Mean over forecast scenarios of max/mean GPU load, per layer [L]."""
    loads = gpu_loads(phy2log, fc.scenarios, layout.num_gpus, dispatch, layout.num_nodes)
    out: FloatArray = imbalance(loads).mean(axis=0)
    return out


def respect_current(
    fresh: IntArray,
    current: IntArray,
    fc: Forecast,
    layout: Layout,
    dispatch: str,
    max_moves: int | None,
    min_layer_gain: float,
) -> tuple[IntArray, BoolArray]:
    """Final map [L, P] and which layers changed."""
    num_layers = layout.num_layers
    matched = match_to_current(fresh, current, layout, dispatch)
    if max_moves is None:  # no cap: the fresh plan, unless keeping the current one is as good
        repairs = [current]
    else:  # repairs on several budgets; the cap then goes to the layers where a copy buys the most
        target = expert_counts(fresh, layout.num_experts)
        share = max_moves // num_layers
        # a cap under one copy per layer: one repair on the whole cap, which allocate gives to
        # the layers where it buys most (even shares of it would be zero)
        budgets = sorted({int(f * share) for f in REPAIR_SHARES} - {0}) or [max_moves] * (max_moves > 0)
        repairs = [repair_current(current, target, fc, layout, dispatch, b) for b in budgets]
    options = np.stack([current, *repairs, matched])  # [O, L, P]
    obj = np.stack([expected_imbalance(m, fc, layout, dispatch) for m in options])  # [O, L]
    cost = np.stack([gpu_moves_per_layer(current, m, layout.num_gpus) for m in options])
    layers = np.arange(num_layers)
    if max_moves is None:
        near_best = obj <= obj.min(axis=0, keepdims=True) * (1 + TIE)
        choice = np.argmin(np.where(near_best, cost, np.inf), axis=0)
    else:
        # only options worth their moves compete for the cap (else copies go to a layer that
        # min_layer_gain then keeps as it is)
        worth = obj <= obj[0] * (1 + 1e-12)
        if min_layer_gain > 0:
            worth &= (obj[0] - obj) >= min_layer_gain * np.maximum(obj[0], 1e-300)
            worth[0] = True
        choice = allocate(np.where(worth, obj, np.inf), cost, max_moves)
    base = obj[0]
    rel_gain = (base - obj[choice, layers]) / np.maximum(base, 1e-300)
    choice = np.where((rel_gain < min_layer_gain) | (rel_gain <= 0), 0, choice)
    final = options[choice, layers]
    return final, (final != current).any(axis=1)


def allocate(obj: FloatArray, cost: IntArray, budget: int) -> IntArray:
    """Per layer, the option [O, L] minimising the summed objective within ``budget`` copies in all
    (exact, by dynamic programming over copies spent; of equal sums, the fewest copies).
    Option 0 must cost nothing and have a finite objective."""
    num_opts, num_layers = obj.shape
    budget = int(min(budget, cost.max(axis=0).sum()))
    best = np.zeros(budget + 1)  # least summed objective of the layers so far within b copies
    pick = np.zeros((num_layers, budget + 1), dtype=np.int64)
    for layer in range(num_layers):
        trial = np.full((num_opts, budget + 1), np.inf)
        for o in range(num_opts):
            c = int(cost[o, layer])
            if c <= budget and np.isfinite(obj[o, layer]):
                trial[o, c:] = best[: budget + 1 - c] + obj[o, layer]
        pick[layer] = np.argmin(trial, axis=0)
        best = trial[pick[layer], np.arange(budget + 1)]
    spend = int(np.flatnonzero(best <= best[-1] + 1e-12 * max(1.0, abs(best[-1])))[0])
    choice = np.zeros(num_layers, dtype=np.int64)
    for layer in range(num_layers - 1, -1, -1):
        choice[layer] = pick[layer, spend]
        spend -= int(cost[choice[layer], layer])
    return choice


def repair_current(
    current: IntArray, target: IntArray, fc: Forecast, layout: Layout, dispatch: str, budget: int
) -> IntArray:
    """``current`` moved toward ``target`` copy counts and the scenarios, at most ``budget`` loads per layer."""
    num_layers = layout.num_layers
    mean, scen = fc.mean, fc.scenarios.transpose(1, 0, 2)
    slots, per_node, nodes = layout.slots_per_gpu, layout.gpus_per_node, layout.num_nodes
    if not layout.hierarchical:
        by_node = dispatch == "static" and nodes > 1
        domain = np.arange(layout.num_gpus) // per_node if by_node else np.arange(layout.num_gpus)
        state = current.reshape(num_layers, layout.num_gpus, slots)
        bins = Bins(layout.num_gpus, slots, domain)
        out = repair_rows(state, target, mean, scen, bins, np.full(num_layers, budget))
        return out.reshape(num_layers, -1)
    # hierarchical: repair inside each node, on layers whose groups sit whole on one node
    size = layout.num_experts // layout.num_groups
    node_of_slot = np.arange(layout.num_slots) // (per_node * slots)
    group = current // size
    home = np.full((num_layers, layout.num_groups), -1)
    np.maximum.at(home, (np.arange(num_layers)[:, None], group), node_of_slot[None, :])
    lowest = np.full((num_layers, layout.num_groups), nodes)
    np.minimum.at(lowest, (np.arange(num_layers)[:, None], group), node_of_slot[None, :])
    per_node_groups = np.stack([(home == n).sum(axis=1) for n in range(nodes)], axis=1)
    ok = (home == lowest).all(axis=1) & (per_node_groups == layout.num_groups // nodes).all(axis=1)
    out = current.copy()
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return out
    # node-local expert ids: the node's groups in ascending order
    groups_of_node = np.argsort(home[idx], axis=1, kind="stable").reshape(idx.size, nodes, -1)
    experts = (groups_of_node[..., None] * size + np.arange(size)).reshape(idx.size * nodes, -1)  # [R, E/N]
    rows = experts.shape[0]
    to_local = np.zeros((rows, layout.num_experts), dtype=np.int64)
    np.put_along_axis(to_local, experts, np.broadcast_to(np.arange(experts.shape[1]), experts.shape), axis=1)
    state = current[idx].reshape(rows, per_node, slots)
    state_local = np.take_along_axis(to_local, state.reshape(rows, -1), axis=1).reshape(state.shape)
    row_mean = np.take_along_axis(np.repeat(mean[idx], nodes, axis=0), experts, axis=1)
    row_target = np.take_along_axis(np.repeat(target[idx], nodes, axis=0), experts, axis=1)
    row_scen = np.take_along_axis(
        np.repeat(scen[idx], nodes, axis=0),
        np.broadcast_to(experts[:, None, :], (rows, scen.shape[1], experts.shape[1])),
        axis=2,
    )
    # a node whose target counts do not fill its slots keeps its own counts
    fits = row_target.sum(axis=1) == per_node * slots
    row_target = np.where(
        fits[:, None], row_target, expert_counts(state_local.reshape(rows, -1), experts.shape[1])
    )
    bins = Bins(per_node, slots, np.arange(per_node))
    share = np.full(rows, budget // nodes)
    better = repair_rows(state_local, row_target, row_mean, row_scen, bins, share)
    glob = np.take_along_axis(experts, better.reshape(rows, -1), axis=1)
    out[idx] = glob.reshape(idx.size, -1)
    return out


def repair_rows(
    state: IntArray, target: IntArray, mean: FloatArray, scen: FloatArray, bins: Bins, budget: IntArray
) -> IntArray:
    """Rows of GPUs [B, G, S]: relabel spare copies toward ``target`` [B, E], then exchange copies on scenarios.

    A relabel shifts load by a whole copy, which the exchanges must then absorb; per row, the
    result is compared with exchanges alone (no relabel) and the lower expected peak is kept,
    so a repair never ends above the current placement.
    """
    rows, _, slots = state.shape
    num_experts = mean.shape[1]
    original = state.reshape(rows, -1)
    left0 = np.asarray(budget, dtype=np.int64)
    flat, counts, left = relabel_rows(original, target, mean, bins, left0)
    if slots == 1:
        return flat.reshape(state.shape)
    relabelled = _exchange(flat, counts, mean, scen, bins, left, original)
    changed = (flat != original).any(axis=1)
    if not changed.any():
        return relabelled.reshape(state.shape)
    kept = _exchange(
        original[changed],
        expert_counts(original[changed], num_experts),
        mean[changed],
        scen[changed],
        bins,
        left0[changed],
        original[changed],
    )
    j_new = _peak(relabelled[changed], scen[changed], num_experts, bins)
    j_old = _peak(kept, scen[changed], num_experts, bins)
    out = relabelled.copy()
    out[np.flatnonzero(changed)[j_old < j_new]] = kept[j_old < j_new]
    return out.reshape(state.shape)


def _peak(flat: IntArray, scen: FloatArray, num_experts: int, bins: Bins) -> FloatArray:
    """Expected peak of rows of slots [B, P] (copies split evenly)."""
    layout = np.arange(flat.shape[1]).reshape(1, bins.num_gpus, bins.slots).repeat(flat.shape[0], axis=0)
    return expected_peak(gpu_scenario_loads(item_loads(scen, expert_counts(flat, num_experts), flat), layout))


def _exchange(
    flat: IntArray,
    counts: IntArray,
    mean: FloatArray,
    scen: FloatArray,
    bins: Bins,
    left: IntArray,
    original: IntArray,
) -> IntArray:
    """Re-pack a subset, then exchange copies, within what is left of each row's budget."""
    rows, total = flat.shape
    num_gpus, slots = bins.num_gpus, bins.slots
    if bins.num_domains == num_gpus:  # conflict domain = GPU: a subset can be re-packed on its own
        flat, left = repack_subset(flat, counts, mean, scen, bins, left, original)
    # the budget counts copies loaded: an exchange that moves a copy on, or back, loads fewer than two
    loads = item_loads(scen, counts, flat)  # items are the slots themselves
    held = np.zeros((rows, num_gpus, mean.shape[1]), dtype=bool)
    held[np.arange(rows)[:, None], np.arange(total) // slots, original] = True
    start = np.broadcast_to(np.arange(total).reshape(1, num_gpus, slots), (rows, num_gpus, slots)).copy()
    order = pair_refine(loads, flat, mean.shape[1], bins, start, swaps=np.maximum(left, 0), held=held)
    out: IntArray = np.take_along_axis(flat, order.reshape(rows, -1), axis=1)
    return out


def relabel_rows(
    original: IntArray, target: IntArray, mean: FloatArray, bins: Bins, budget: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """Spare copies relabelled toward ``target`` counts where the shift is real. -> (rows, counts, budget left).

    Indexing goes through flat (row, expert) offsets and one GPU's load is its copy's when it has one
    slot: ufunc.at over 2-D indices, and a [rows, domains, experts] table, took most of the time at 288 GPUs.
    """
    rows = original.shape[0]
    slots, num_gpus = bins.slots, bins.num_gpus
    num_experts = mean.shape[1]
    flat = original.copy()
    left = budget.copy()
    row_ids = np.arange(rows)
    counts = expert_counts(flat, num_experts)
    slot_dom = np.repeat(bins.domain, slots)
    offset = row_ids[:, None] * num_experts  # flat index of (row, expert)
    for _ in range(int(np.abs(counts - target).sum(axis=1).max(initial=0)) // 2 + 1):
        need = counts < target
        go = need.any(axis=1) & (left > 0)
        if not go.any():
            break
        # the neediest expert (most load per copy) takes the spare copy whose GPU ends up lightest
        per_copy = mean / counts
        y = np.argmax(np.where(need, per_copy, -np.inf), axis=1)
        # slots whose domain already holds a copy of y cannot take another
        r_hit, s_hit = np.nonzero(flat == y[:, None])
        holds = np.zeros((rows, bins.num_domains), dtype=bool)
        holds[r_hit, slot_dom[s_hit]] = True
        idx = offset + flat
        spare = (counts.ravel()[idx] > target.ravel()[idx]) & ~holds[:, slot_dom]
        slot_load = per_copy.ravel()[idx]
        gpu_load = slot_load.reshape(rows, num_gpus, slots).sum(axis=2)
        slot_gpu = np.repeat(gpu_load, slots, axis=1) if slots > 1 else gpu_load
        # receiving GPU: loses the spare copy, gains a copy of y; the donor expert's other copies grow
        y_new = mean[row_ids, y] / (counts[row_ids, y] + 1)
        receive = slot_gpu - slot_load + y_new[:, None]
        if slots == 1:  # a GPU's load is its one copy's
            top = per_copy.ravel()
        else:
            top = np.full(rows * num_experts, -np.inf)
            np.maximum.at(top, idx.ravel(), slot_gpu.ravel())
        raise_base = mean / np.maximum(counts - 1, 1)  # a donor's per-copy load after it gives a copy
        raised = (top + (raise_base - per_copy).ravel())[idx]
        pos = np.argmin(np.where(spare, np.maximum(receive, raised), np.inf), axis=1)
        go &= spare[row_ids, pos]
        x_all = flat[row_ids, pos]
        # only where it lowers the larger per-copy load of the two experts (a real shift, not a tie)
        x_new = raise_base[row_ids, x_all]
        go &= np.maximum(x_new, y_new) < per_copy[row_ids, y] * (1 - 1e-9)
        r, p = row_ids[go], pos[go]
        x = x_all[go]
        counts[r, x] -= 1
        counts[r, y[go]] += 1
        flat[r, p] = y[go]
        left[r] -= 1
        if not go.any():
            break
    return flat, counts, left


def repack_subset(
    flat: IntArray,
    counts: IntArray,
    mean: FloatArray,
    scen: FloatArray,
    bins: Bins,
    left: IntArray,
    original: IntArray,
) -> tuple[IntArray, IntArray]:
    """Re-pack the copies of the busiest and the idlest GPUs together (a large step local
    exchanges cannot make), matched back onto those GPUs so that few copies actually move.

    Kept per row where it lowers the expected peak within the row's budget. Returns the rows
    and the budget left.
    """
    rows, total = flat.shape
    slots, num_gpus = bins.slots, bins.num_gpus
    num_experts = mean.shape[1]
    k = int(min(num_gpus // 2, max(0, int(left.max(initial=0))) // (2 * slots)))
    if k < 1:
        return flat, left
    loads = item_loads(scen, counts, flat)  # [B, I, K]
    layout = np.arange(total).reshape(1, num_gpus, slots).repeat(rows, axis=0)
    gpu_load = gpu_scenario_loads(loads, layout)  # [B, G, K]
    before = expected_peak(gpu_load)
    order = np.argsort(-gpu_load.mean(axis=2), axis=1, kind="stable")
    chosen = np.concatenate([order[:, :k], order[:, -k:]], axis=1)  # [B, 2k]
    items = (chosen[:, :, None] * slots + np.arange(slots)).reshape(rows, -1)  # slot positions
    sub_expert = np.take_along_axis(flat, items, axis=1)
    sub_load = np.take_along_axis(loads, items[:, :, None], axis=1)
    sub_bins = Bins(2 * k, slots, np.arange(2 * k))
    weight = sub_load.mean(axis=2)
    placed = pair_refine(
        sub_load, sub_expert, num_experts, sub_bins, lpt(weight, sub_expert, num_experts, sub_bins)
    )
    new_sub = np.take_along_axis(sub_expert, placed.reshape(rows, -1), axis=1).reshape(rows, 2 * k, slots)
    old_sub = np.take_along_axis(flat, items, axis=1).reshape(rows, 2 * k, slots)
    overlap = (
        (new_sub[:, :, None, :, None] == old_sub[:, None, :, None, :]).any(axis=4).sum(axis=3).astype(float)
    )
    assign = assign_max_overlap(overlap)
    moved = np.empty_like(new_sub)
    moved[np.arange(rows)[:, None], assign] = new_sub
    moved = align_slots(moved, old_sub)
    trial = flat.copy()
    np.put_along_axis(trial, items, moved.reshape(rows, -1), axis=1)
    after = expected_peak(gpu_scenario_loads(item_loads(scen, counts, trial), layout))
    extra = gpu_moves_per_layer(original, trial, num_gpus) - gpu_moves_per_layer(original, flat, num_gpus)
    take = (after < before * (1 - 1e-9)) & (extra <= left)
    out = np.where(take[:, None], trial, flat)
    return out, left - np.where(take, extra, 0)
