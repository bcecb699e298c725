"""Improve the current placement with few moves (each moved slot costs a weight transfer).

A fresh plan reshuffles most slots even when traffic barely changed. Here we start from
what the GPUs hold and apply the single change that buys the most balance per moved slot,
repeatedly, until nothing helps or the budget is spent:

* swap two copies between the usual bottleneck GPU and another GPU (two slots move);
* relabel one slot: give an expert on the bottleneck GPU one more copy, taking the slot
  of an expert with copies to spare, or turn a spare copy on the bottleneck GPU into a copy
  of another expert (one slot moves);
* when single changes no longer help but budget is left, re-pack the copies of the
  busiest and the idlest GPUs together (a large-neighbourhood step that escapes the local
  optimum), then match the result back onto those GPUs so few slots actually move.

Balance is judged like the fresh plan's: the mean over forecast scenarios of the busiest
GPU's load (judging on the forecast mean alone overfits it and loses the hedge). Ties at
the peak are broken lexicographically (lowering the bottleneck GPU earns a small credit),
otherwise GPUs holding copies of one expert block each other. The budget is shared by all
rows (layers): each round every row proposes its best change, best gain per move first.
"""

from __future__ import annotations

import numpy as np

from .layout import FloatArray, IntArray
from .matching import align_slots, hungarian
from .one_slot import exchange_copies
from .packing import Bins, lpt, refine, refine_scenarios

MIN_GAIN = 1e-5  # relative gain below which a change is not worth a move
TIE_CREDIT = 1e-3  # weight of lowering the bottleneck GPU when that does not lower the peak
RELABEL_SHORTLIST = 16  # relabels per row screened on the mean, then judged on scenarios
MAX_TIE_BREAKS = 8  # a row stops after this many changes in a row that did not lower its objective
COLD_EXPERTS = 16
DONOR_SLOTS = 32  # spare copies per row considered as the slot a new copy takes
PARTNER_SLOTS = 96  # swap partners per row: the copies on the GPUs lightest on average  # lightest-per-copy experts a bottleneck slot may be turned into


def improve(
    state: IntArray,
    scenarios: FloatArray,
    mean: FloatArray,
    bins: Bins,
    budget: int | None,
    max_rounds: int | None = None,
) -> IntArray:
    """state [B, G, S] row-local expert ids; scenarios [B, K, E]; mean [B, E]. Returns the improved state."""
    rows, num_gpus, num_slots = state.shape
    if num_slots == 1:  # only copy counts matter: exchange copies between experts
        return exchange_copies(state[..., 0], scenarios, budget, bins.domain)[..., None]
    original = state
    state = state.copy()
    left = np.inf if budget is None else float(budget)
    active = np.ones(rows, dtype=bool)
    stalled = np.zeros(rows, dtype=np.int64)  # consecutive changes that only broke ties
    repacked = bins.num_domains != num_gpus  # node-wide conflict domains: skip the re-pack
    rounds = max_rounds if max_rounds is not None else 2 * num_gpus * num_slots
    for _ in range(rounds):
        if not active.any() or left <= 0:
            break
        idx = np.flatnonzero(active)
        gain, primary, cost, proposal = _best_changes(
            state[idx], original[idx], scenarios[idx], mean[idx], bins
        )
        stalled[idx] = np.where(primary > MIN_GAIN, 0, stalled[idx] + 1)
        ok = (gain > MIN_GAIN) & (stalled[idx] <= MAX_TIE_BREAKS)
        active[idx[~ok]] = False
        for k in np.argsort(-(gain / np.maximum(cost, 0.5)), kind="stable"):
            if not ok[k]:
                continue
            if cost[k] > left:
                active[idx[k]] = False
                continue
            state[idx[k]] = proposal[k]
            left -= max(float(cost[k]), 0.0)
        if not active.any() and left > 0 and not repacked:
            repacked = True
            state, spent = _repack(state, original, scenarios, mean, bins, left)
            left -= spent
            active[:] = spent > 0
            stalled[:] = 0
    return state


def _best_changes(
    state: IntArray, original: IntArray, scen: FloatArray, mean: FloatArray, bins: Bins
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """Per row: gain (relative, with tie credit), objective drop alone, slots moved, state after."""
    n, num_gpus, num_slots = state.shape
    num_experts = mean.shape[1]
    local = np.arange(n)
    cell = (local[:, None, None] * num_gpus + np.arange(num_gpus)[None, :, None]) * num_experts + state
    held = (
        np.bincount(cell.ravel(), minlength=n * num_gpus * num_experts)
        .reshape(n, num_gpus, num_experts)
        .astype(float)
    )
    copies = np.maximum(held.sum(axis=1), 1.0)  # [n, E]
    per_copy = scen / copies[:, None, :]  # [n, K, E]
    z = np.einsum("nge,nke->nkg", held, per_copy)  # scenario GPU loads
    current = z.max(axis=2).mean(axis=1)
    peaks = (local[:, None] * num_gpus + z.argmax(axis=2)).ravel()
    freq = np.bincount(peaks, minlength=n * num_gpus).reshape(n, num_gpus).astype(float)
    zm = z.mean(axis=1)
    focus = np.argmax(freq + 1e-3 * zm / np.maximum(zm.max(axis=1, keepdims=True), 1e-300), axis=1)
    dom_held = np.zeros((n, bins.num_domains, num_experts))
    for g in range(num_gpus):
        dom_held[:, bins.domain[g]] += held[:, g]
    flat = state.reshape(n, -1)
    flat_orig = original.reshape(n, -1)
    changed = (flat != flat_orig).astype(float)
    slot_gpu = np.repeat(np.arange(num_gpus), num_slots)

    gain_s, prim_s, cost_s, a_pos, b_pos = _swaps(
        z, per_copy, flat, flat_orig, changed, focus, current, dom_held, bins, slot_gpu
    )
    gain_r, prim_r, cost_r, p_pos, y_new = _relabels(
        z, held, copies, scen, mean, flat, flat_orig, changed, focus, current, dom_held, bins, slot_gpu
    )
    use_swap = gain_s / np.maximum(cost_s, 0.5) >= gain_r / np.maximum(cost_r, 0.5)
    gain = np.where(use_swap, gain_s, gain_r)
    primary = np.where(use_swap, prim_s, prim_r)
    cost = np.where(use_swap, cost_s, cost_r)
    proposal = flat.copy()
    for r in range(n):
        if gain[r] <= 0:
            continue
        if use_swap[r]:
            proposal[r, a_pos[r]], proposal[r, b_pos[r]] = flat[r, b_pos[r]], flat[r, a_pos[r]]
        else:
            proposal[r, p_pos[r]] = y_new[r]
    return gain, primary, cost, proposal.reshape(state.shape)


def _other_peak(z: FloatArray, focus: IntArray, partner: IntArray) -> FloatArray:
    """[n, K, C]: per scenario, the largest load outside the focus GPU and each candidate's GPU."""
    n, num_scen, num_gpus = z.shape
    top = np.argsort(-z, axis=2)[:, :, :3]
    top_val = np.take_along_axis(z, top, axis=2)
    if num_gpus < 3:
        top = np.concatenate([top, np.full((n, num_scen, 3 - num_gpus), -1)], axis=2)
        top_val = np.concatenate([top_val, np.full((n, num_scen, 3 - num_gpus), -np.inf)], axis=2)
    ok = (top != focus[:, None, None])[:, :, None, :] & (top[:, :, None, :] != partner[:, None, :, None])
    out: FloatArray = np.where(
        ok[..., 0],
        top_val[:, :, None, 0],
        np.where(ok[..., 1], top_val[:, :, None, 1], top_val[:, :, None, 2]),
    )
    return out


def _swaps(
    z: FloatArray,
    per_copy: FloatArray,
    flat: IntArray,
    flat_orig: IntArray,
    changed: FloatArray,
    focus: IntArray,
    current: FloatArray,
    dom_held: FloatArray,
    bins: Bins,
    slot_gpu: IntArray,
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray, IntArray]:
    """Best swap of a copy on the focus GPU with a copy on one of the lightest GPUs."""
    n, num_scen, num_gpus = z.shape
    num_slots = flat.shape[1] // num_gpus
    local = np.arange(n)
    a_pos = focus[:, None] * num_slots + np.arange(num_slots)[None, :]  # [n, S]
    ea = np.take_along_axis(flat, a_pos, axis=1)
    za = np.take_along_axis(per_copy, np.broadcast_to(ea[:, None, :], (n, num_scen, num_slots)), axis=2)
    light = np.argsort(z.mean(axis=1), axis=1, kind="stable")[
        :, : max(1, min(num_gpus, PARTNER_SLOTS // num_slots))
    ]
    cand = (light[:, :, None] * num_slots + np.arange(num_slots)).reshape(n, -1)  # partner slots [n, C]
    eb = np.take_along_axis(flat, cand, axis=1)
    partner = slot_gpu[cand]
    zb = np.take_along_axis(per_copy, np.broadcast_to(eb[:, None, :], (n, num_scen, eb.shape[1])), axis=2)
    z_focus = z[local, :, focus]
    z_partner = np.take_along_axis(z, np.broadcast_to(partner[:, None, :], zb.shape), axis=2)  # [n, K, C]
    delta = zb[:, :, None, :] - za[:, :, :, None]  # [n, K, S, C]
    new_focus = z_focus[:, :, None, None] + delta
    after = np.maximum(
        np.maximum(new_focus, z_partner[:, :, None, :] - delta), _other_peak(z, focus, partner)[:, :, None, :]
    )
    obj = after.mean(axis=1)
    focus_obj = new_focus.mean(axis=1)
    dom_f = bins.domain[focus]
    dom_b = bins.domain[partner]
    a_ok = dom_held[local[:, None, None], dom_b[:, None, :], ea[:, :, None]] == 0
    b_ok = dom_held[local[:, None], dom_f[:, None], eb] == 0
    valid = (partner != focus[:, None])[:, None, :] & (ea[:, :, None] != eb[:, None, :])
    valid &= (dom_b == dom_f[:, None])[:, None, :] | (a_ok & b_ok[:, None, :])
    valid &= (obj <= current[:, None, None]) & (focus_obj < z_focus.mean(axis=1)[:, None, None])
    gain = np.where(
        valid, _lexi(current[:, None, None], obj, z_focus.mean(axis=1)[:, None, None], focus_obj), -np.inf
    )
    orig_a = np.take_along_axis(flat_orig, a_pos, axis=1)
    orig_b = np.take_along_axis(flat_orig, cand, axis=1)
    moved_after = (eb[:, None, :] != orig_a[:, :, None]).astype(float) + (
        ea[:, :, None] != orig_b[:, None, :]
    )
    moved_before = (
        np.take_along_axis(changed, a_pos, axis=1)[:, :, None]
        + np.take_along_axis(changed, cand, axis=1)[:, None, :]
    )
    cost = moved_after - moved_before
    score = (gain / np.maximum(cost, 0.5)).reshape(n, -1)
    pick = np.argmax(score, axis=1)
    s_idx, c_idx = np.divmod(pick, cand.shape[1])
    primary = ((current[:, None, None] - obj) / current[:, None, None]).reshape(n, -1)[local, pick]
    return (
        gain.reshape(n, -1)[local, pick],
        primary,
        cost.reshape(n, -1)[local, pick],
        a_pos[local, s_idx],
        cand[local, c_idx],
    )


def _relabels(
    z: FloatArray,
    held: FloatArray,
    copies: FloatArray,
    scen: FloatArray,
    mean: FloatArray,
    flat: IntArray,
    flat_orig: IntArray,
    changed: FloatArray,
    focus: IntArray,
    current: FloatArray,
    dom_held: FloatArray,
    bins: Bins,
    slot_gpu: IntArray,
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray, IntArray]:
    """Best relabel of one slot (x -> y), shortlisted on the mean, judged on scenarios."""
    n, num_scen, num_gpus = z.shape
    num_slots = flat.shape[1] // num_gpus
    num_experts = mean.shape[1]
    local = np.arange(n)[:, None]
    on_focus = focus[:, None] * num_slots + np.arange(num_slots)[None, :]
    y_focus = np.take_along_axis(flat, on_focus, axis=1)
    # (a) an expert on the focus GPU takes a slot whose expert has copies to spare
    slot_copies = np.take_along_axis(copies, flat, axis=1)
    slot_mean = np.take_along_axis(mean, flat, axis=1)
    # donors: spare copies whose removal raises their expert's per-copy load the least
    raise_by = np.where(slot_copies >= 2, slot_mean / np.maximum(slot_copies - 1, 1) / slot_copies, np.inf)
    width = min(DONOR_SLOTS, flat.shape[1])
    spare_pos = np.argsort(raise_by, axis=1, kind="stable")[:, :width]
    pos_a = np.tile(spare_pos, (1, num_slots))
    y_a = np.repeat(y_focus, width, axis=1)
    # (b) a slot on the focus GPU becomes one of the experts that are lightest per copy
    cold = np.argsort(mean / (copies + 1.0), axis=1, kind="stable")[:, : min(COLD_EXPERTS, num_experts)]
    pos_b = np.repeat(on_focus, cold.shape[1], axis=1)
    y_b = np.tile(cold, (1, num_slots))
    pos = np.concatenate([pos_a, pos_b], axis=1)
    y = np.concatenate([y_a, y_b], axis=1)
    x = np.take_along_axis(flat, pos, axis=1)
    h = slot_gpu[pos]
    cx, cy = copies[local, x], copies[local, y]
    valid = (cx >= 2) & (x != y) & (dom_held[local, bins.domain[h], y] == 0)
    # screen on the mean: drop in the focus GPU's mean load, penalised by the worst GPU after
    mx, my = mean[local, x], mean[local, y]
    dx = np.where(cx >= 2, mx * (1.0 / np.maximum(cx - 1, 1) - 1.0 / cx), 0.0)
    dy = my * (1.0 / (cy + 1) - 1.0 / cy)
    held_t = held.transpose(0, 2, 1)  # [n, E, G]
    load_mean = np.einsum("nge,ne->ng", held, mean / copies)
    new = load_mean[:, None, :] + held_t[local, x] * dx[..., None] + held_t[local, y] * dy[..., None]
    new[local, np.arange(pos.shape[1])[None, :], h] += my / (cy + 1) - mx / np.maximum(cx - 1, 1)
    screen = np.where(valid, -new.max(axis=2), -np.inf)
    k = min(RELABEL_SHORTLIST, pos.shape[1])
    short = np.argpartition(-screen, k - 1, axis=1)[:, :k]  # [n, k]
    xs, ys, hs, ps = (np.take_along_axis(a, short, axis=1) for a in (x, y, h, pos))
    vs = np.take_along_axis(valid, short, axis=1)
    cxs, cys = copies[local, xs], copies[local, ys]
    sx = np.take_along_axis(scen, np.broadcast_to(xs[:, None, :], (n, num_scen, k)), axis=2)  # [n, K, k]
    sy = np.take_along_axis(scen, np.broadcast_to(ys[:, None, :], (n, num_scen, k)), axis=2)
    ddx = sx * (1.0 / np.maximum(cxs - 1, 1) - 1.0 / cxs)[:, None, :]
    ddy = sy * (1.0 / (cys + 1) - 1.0 / cys)[:, None, :]
    znew = (
        z[:, :, None, :]
        + held_t[local, xs][:, None, :, :] * ddx[..., None]
        + held_t[local, ys][:, None, :, :] * ddy[..., None]
    )  # [n, K, k, G]
    at_h = sy / (cys + 1)[:, None, :] - sx / np.maximum(cxs - 1, 1)[:, None, :]
    onehot = hs[:, None, :, None] == np.arange(num_gpus)[None, None, None, :]
    znew = znew + onehot * at_h[..., None]
    obj = znew.max(axis=3).mean(axis=1)  # [n, k]
    focus_obj = znew[np.arange(n)[:, None], :, np.arange(k)[None, :], focus[:, None]].mean(axis=2)
    base_focus = z[np.arange(n), :, focus].mean(axis=1)
    ok = vs & (obj <= current[:, None]) & (focus_obj < base_focus[:, None])
    gain = np.where(ok, _lexi(current[:, None], obj, base_focus[:, None], focus_obj), -np.inf)
    cost = (ys != flat_orig[local, ps]).astype(float) - changed[local, ps]
    best = np.argmax(gain / np.maximum(cost, 0.5), axis=1)
    r = np.arange(n)
    primary = (current - obj[r, best]) / current
    return gain[r, best], primary, cost[r, best], ps[r, best], ys[r, best]


def _lexi(
    peak: FloatArray, after: FloatArray, focus_before: FloatArray, focus_after: FloatArray
) -> FloatArray:
    """Relative drop of the objective, plus a small credit for lowering the bottleneck GPU."""
    out: FloatArray = ((peak - after) + TIE_CREDIT * (focus_before - focus_after)) / peak
    return out


def _objective(state: IntArray, scen: FloatArray, num_experts: int) -> FloatArray:
    """Mean over scenarios of the busiest GPU, per row."""
    n, num_gpus, _ = state.shape
    cell = (np.arange(n)[:, None, None] * num_gpus + np.arange(num_gpus)[None, :, None]) * num_experts + state
    held = np.bincount(cell.ravel(), minlength=n * num_gpus * num_experts).reshape(n, num_gpus, num_experts)
    copies = np.maximum(held.sum(axis=1), 1)
    z = np.einsum("nge,nke->nkg", held.astype(float), scen / copies[:, None, :])
    out: FloatArray = z.max(axis=2).mean(axis=1)
    return out


def _repack(
    state: IntArray, original: IntArray, scen: FloatArray, mean: FloatArray, bins: Bins, budget: float
) -> tuple[IntArray, float]:
    """Re-pack the copies of the k busiest and k idlest GPUs of every row; keep it where it pays."""
    rows, num_gpus, num_slots = state.shape
    num_experts = mean.shape[1]
    share = budget / rows
    k = int(min(num_gpus // 2, share // (2 * num_slots)))
    if k < 1:
        return state, 0.0
    held = np.zeros((rows, num_gpus, num_experts))
    np.add.at(held, (np.arange(rows)[:, None, None], np.arange(num_gpus)[None, :, None], state), 1.0)
    copies = np.maximum(held.sum(axis=1), 1.0)
    load = np.einsum("nge,ne->ng", held, mean / copies)
    order = np.argsort(-load, axis=1, kind="stable")
    chosen = np.concatenate([order[:, :k], order[:, -k:]], axis=1)  # [B, 2k]
    sub = np.take_along_axis(state, chosen[:, :, None].repeat(num_slots, axis=2), axis=1)  # [B, 2k, S]
    items = sub.reshape(rows, -1)
    weight = np.take_along_axis(mean / copies, items, axis=1)
    sub_bins = Bins(2 * k, num_slots, np.arange(2 * k))
    layout = refine(weight, items, num_experts, sub_bins, lpt(weight, items, num_experts, sub_bins))
    per_copy = scen / copies[:, None, :]
    item_load = np.take_along_axis(
        per_copy, np.broadcast_to(items[:, None, :], (rows, scen.shape[1], items.shape[1])), axis=2
    )
    layout = refine_scenarios(item_load, items, num_experts, sub_bins, layout)
    new_sub = np.take_along_axis(items, layout.reshape(rows, -1), axis=1).reshape(rows, 2 * k, num_slots)
    # put each new GPU content where the old content it shares most with was
    old_sub = np.take_along_axis(original, chosen[:, :, None].repeat(num_slots, axis=2), axis=1)
    overlap = (
        (new_sub[:, :, None, :, None] == old_sub[:, None, :, None, :]).any(axis=4).sum(axis=3).astype(float)
    )
    assign = hungarian(overlap.max() - overlap)
    placed = np.empty_like(new_sub)
    placed[np.arange(rows)[:, None], assign] = new_sub
    placed = align_slots(placed, old_sub)
    trial = state.copy()
    np.put_along_axis(trial, chosen[:, :, None].repeat(num_slots, axis=2), placed, axis=1)
    before = _objective(state, scen, num_experts)
    after = _objective(trial, scen, num_experts)
    cost = (trial != original).reshape(rows, -1).sum(axis=1) - (state != original).reshape(rows, -1).sum(
        axis=1
    )
    gain = (before - after) / np.maximum(before, 1e-300)
    take = (gain > MIN_GAIN) & (cost <= share)
    out = np.where(take[:, None, None], trial, state)
    return out, float(np.maximum(cost, 0)[take].sum())
