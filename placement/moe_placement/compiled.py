"""The planner's hot loops compiled (numba), one row at a time: the same decisions, the same plans.

The numpy versions spend most of their time dispatching small array operations (a V3 row
has a few hundred candidate exchanges per round of search.pair_refine, and the greedy of
packing.lpt places one copy per step), so the same loops over one row at a time take about half
the time at DeepSeek-V3 shape (docs/placement.md). Every decision follows the numpy code step for step: the same float32 loads
updated by the same operations, float64 sums of loads that search.on_grid puts on one grid per
row (so every sum is exact in any order, and numpy's pairwise sums and these loops agree), the
same stable orders and first-of-equals ties. tests/placement/test_compiled.py holds both to
identical layouts. These loops check no bounds: the callers check every index first.
The only coupling between rows in the search is how many GPUs focus in a round (the most
bottlenecks of any row still searching), taken before any row of the round moves.

numba is optional (``moe-placement[fast]``): without it, the numpy code runs, with the same
answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

try:
    import numba
except ImportError:  # the numpy code answers alike
    numba = None  # type: ignore[assignment]

AVAILABLE = numba is not None
# whether the planner uses these loops (when numba is there); tests switch it off to compare
ENABLED = AVAILABLE
F = TypeVar("F", bound=Callable[..., Any])


def require_indices(name: str, values: Any, upper: int) -> None:
    """Every index in [0, upper): compiled loops do not check bounds (numpy would raise), so a bad
    index must stop here, as a ValueError, not read or write outside an array."""
    values = np.asarray(values)
    if values.size and (values.min() < 0 or values.max() >= upper):
        raise ValueError(f"{name}: indices must lie in [0, {upper}), got {values.min()}..{values.max()}")


def _jit(fn: F) -> F:
    """Compiled lazily on first use, cached on disk where numba finds a writable place; unchanged
    without numba (then nothing calls it: the numpy code runs)."""
    if numba is None:
        return fn
    try:
        return numba.njit(cache=True, nogil=True)(fn)  # type: ignore[return-value]
    except RuntimeError:  # no writable cache location (a read-only image): compile per process
        return numba.njit(cache=False, nogil=True)(fn)  # type: ignore[return-value]


@_jit
def _scan(load: Any, freq: Any) -> float:
    """J of one row (mean over scenarios of the busiest GPU's load, [G, K] float32); ``freq`` [G]
    gets how often each GPU is that busiest one (the first of equals, as numpy's argmax)."""
    num_gpus, num_scen = load.shape
    freq[:] = 0
    total = 0.0
    for k in range(num_scen):
        top, at = load[0, k], 0
        for g in range(1, num_gpus):
            if load[g, k] > top:
                top, at = load[g, k], g
        freq[at] += 1
        total += np.float64(top)
    return float(total / num_scen)


@_jit
def _mean_of(load: Any, g: int) -> float:
    """GPU g's mean load over scenarios, summed in float64 (exact: the same as numpy's)."""
    total = 0.0
    for k in range(load.shape[1]):
        total += np.float64(load[g, k])
    return float(total / load.shape[1])


@_jit
def _exchange(layout: Any, load: Any, gpu_mean: Any, zl: Any, h: int, p: int, sa: int, sb: int) -> None:
    """Give GPU h's slot sa for GPU p's slot sb, loads updated as search._apply updates them."""
    ia = layout[h, sa]
    ib = layout[p, sb]
    layout[h, sa] = ib
    layout[p, sb] = ia
    for k in range(load.shape[1]):
        dz = zl[ib, k] - zl[ia, k]
        load[h, k] += dz
        load[p, k] -= dz
    gpu_mean[h] = _mean_of(load, h)
    gpu_mean[p] = _mean_of(load, p)


@_jit
def refine_rounds(
    zl: Any,  # [n, I, K] float32
    zmean: Any,  # [n, I] float64
    item_expert: Any,  # [n, I] int64
    domain: Any,  # [G] int64
    num_domains: int,
    num_experts: int,
    layout: Any,  # [n, G, S] int64, changed in place
    load: Any,  # [n, G, K] float32, changed in place
    left: Any,  # [n] int64 budget, changed in place
    held: Any,  # [n, G, E] bool (with_held) or a placeholder
    with_held: bool,
    budget: bool,
    patience: int,
    max_rounds: int,
    stop_at: int,
    rules: Any,  # search.py's (TOLERANCE, SCREEN_SLACK, MIN_FOCUS, MAX_PARTNERS, PRICE_FLOOR)
) -> None:
    n, num_gpus = layout.shape[0], layout.shape[1]
    min_focus, max_partners = int(rules[2]), int(rules[3])
    num_scen = zl.shape[2]
    shared = num_domains < num_gpus
    active = left > stop_at
    idle = np.zeros(n, dtype=np.int64)
    # per row, kept from round to round: J, how often each GPU is the busiest, the mean loads
    before = np.empty(n)
    freq = np.zeros((n, num_gpus), dtype=np.int64)
    gpu_mean = np.empty((n, num_gpus))
    for r in range(n):
        before[r] = _scan(load[r], freq[r])
        for g in range(num_gpus):
            gpu_mean[r, g] = _mean_of(load[r], g)
    present = np.zeros((num_domains, num_experts), dtype=np.int32)
    floor = np.empty(num_scen, dtype=np.float32)
    for rnd in range(max_rounds):
        # how many GPUs focus: the most that are a bottleneck in some scenario, over working rows
        most = 0
        for r in range(n):
            if active[r]:
                most = max(most, int((freq[r] > 0).sum()))
        if most == 0:
            break
        focus = min(num_gpus // 2, max(min_focus, most))
        per = max(1, min(max_partners, (num_gpus - focus) // focus))
        free = num_gpus - focus
        pick = np.empty((focus, per), dtype=np.int64)
        paired = np.zeros(free, dtype=np.bool_)
        for f in range(focus):
            for m in range(per):
                pick[f, m] = (f + focus * m + rnd) % free
                paired[pick[f, m]] = True
        for r in range(n):
            if active[r]:
                progressed = _row_round(
                    r, zl[r], zmean[r], item_expert[r], domain, num_experts, layout[r], load[r], left, held,
                    with_held, budget, freq[r], gpu_mean[r], present, floor, focus, per, pick, paired, shared,
                    before, rules,
                )  # fmt: skip
                idle[r] = 0 if progressed else idle[r] + 1
                if idle[r] >= patience or left[r] <= stop_at:
                    active[r] = False


@_jit
def _row_round(
    r: int,
    zl: Any,
    zmean: Any,
    expert: Any,
    domain: Any,
    num_experts: int,
    layout: Any,
    load: Any,
    left: Any,
    held: Any,
    with_held: bool,
    budget: bool,
    freq: Any,
    gpu_mean: Any,
    present: Any,
    floor: Any,
    focus: int,
    per: int,
    pick: Any,
    paired: Any,
    shared: bool,
    before: Any,
    rules: Any,
) -> bool:
    """One round of one row (search.pair_refine's loop body): J into before[r]; did it exchange?"""
    num_gpus, slots = layout.shape
    num_scen = load.shape[1]
    j_before = before[r]
    tolerance, slack, price_floor = rules[0], rules[1], rules[4]
    # the pairs: focus GPUs by bottleneck count, then mean load; partners the lightest
    top = max(gpu_mean.max(), 1e-30)
    crit = np.empty(num_gpus)
    for g in range(num_gpus):
        crit[g] = freq[g] + gpu_mean[g] / top
    order = np.argsort(-crit, kind="mergesort")
    heavy = order[:focus]
    rest = order[focus:][::-1]
    has_floor = False
    floor[:] = -np.inf
    for c in range(rest.size):
        if not paired[c]:
            has_floor = True
            g = rest[c]
            for k in range(num_scen):
                if load[g, k] > floor[k]:
                    floor[k] = load[g, k]
    floor_mean = 0.0
    if has_floor:
        for k in range(num_scen):
            floor_mean += np.float64(floor[k])
        floor_mean /= num_scen
    for g in range(num_gpus):  # copies of each expert per conflict domain (zero again below)
        for s in range(slots):
            present[domain[g], expert[layout[g, s]]] += 1
    reach = tolerance * max(j_before, 1e-30)
    best = np.zeros(focus, dtype=np.int64)
    best_gain = np.full(focus, -np.inf)
    best_score = np.full(focus, -np.inf)
    best_price = np.ones(focus, dtype=np.int64)
    for f in range(focus):
        h = heavy[f]
        found = False
        for m in range(per):
            p = rest[pick[f, m]]
            current = 0.0
            for k in range(num_scen):
                v = max(load[h, k], load[p, k])
                current += np.float64(max(v, floor[k]))
            current /= num_scen
            dom_h, dom_p = domain[h], domain[p]
            same = dom_h == dom_p
            for sa in range(slots):
                ia = layout[h, sa]
                ea = expert[ia]
                for sb in range(slots):
                    ib = layout[p, sb]
                    eb = expert[ib]
                    q = (m * slots + sa) * slots + sb
                    price = np.int64(1)
                    if with_held:
                        price = (
                            np.int64(held[r, h, ea]) - np.int64(held[r, h, eb])
                            + np.int64(held[r, p, eb]) - np.int64(held[r, p, ea])
                        )  # fmt: skip
                    md = zmean[ib] - zmean[ia]
                    bound = max(gpu_mean[h] + md, gpu_mean[p] - md)
                    if has_floor:
                        bound = max(bound, floor_mean)
                    if with_held:
                        kept = current - bound >= -slack * current and price <= left[r]
                    else:
                        kept = current - bound >= reach - slack * current
                    # search._allowed: no second copy of an expert in a conflict domain, nor on a GPU
                    if kept:
                        kept = ea != eb
                    if kept and not same:
                        kept = present[dom_p, ea] == 0 and present[dom_h, eb] == 0
                    elif kept and shared:
                        for s in range(slots):
                            if expert[layout[p, s]] == ea or expert[layout[h, s]] == eb:
                                kept = False
                    gain = -np.inf
                    if kept:
                        # the exchange's exact gain (search._exact_gains), written out here: a call
                        # passing arrays costs their reference counts, more than the sum itself
                        cost = 0.0  # exact in any order: the loads are on one grid (search.on_grid)
                        for k in range(num_scen):
                            d = zl[ib, k] - zl[ia, k]
                            cost += np.float64(max(max(load[h, k] + d, load[p, k] - d), floor[k]))
                        gain = current - cost / num_scen
                    score = gain
                    if with_held:
                        score = gain / max(price, price_floor) if gain > 0 else -np.inf
                    if not found or score > best_score[f]:
                        found = True
                        best[f], best_gain[f], best_score[f], best_price[f] = q, gain, score, price
    for g in range(num_gpus):  # only what was counted: zeroing all [D, E] cost more than the round
        for s in range(slots):
            present[domain[g], expert[layout[g, s]]] = 0
    improving = np.empty(focus, dtype=np.bool_)
    for f in range(focus):
        improving[f] = best_gain[f] > reach and np.isfinite(best_score[f])
    if budget:  # the best exchanges per copy loaded that the budget affords
        key = np.empty(focus)
        for f in range(focus):
            key[f] = -best_score[f] if improving[f] else np.inf
        rank = np.argsort(key, kind="mergesort")
        spend = 0
        for f in rank:
            if improving[f]:
                spend += max(best_price[f], 0)
            improving[f] = improving[f] and spend <= left[r]
    # every improving exchange at once; if they interfere, the single best alone; J never rises
    saved_layout, saved_load = layout.copy(), load.copy()
    saved_mean, saved_freq = gpu_mean.copy(), freq.copy()
    for f in range(focus):
        if improving[f]:
            _apply_best(layout, load, gpu_mean, zl, heavy, rest, pick, best[f], f, slots)
    after = _scan(load, freq)
    made = 0
    if after > j_before * (1 - tolerance):
        layout[:, :], load[:, :] = saved_layout, saved_load
        gpu_mean[:], freq[:] = saved_mean, saved_freq
        after = j_before
        if improving.any():
            f1 = _first_best(improving, best_gain)
            _apply_best(layout, load, gpu_mean, zl, heavy, rest, pick, best[f1], f1, slots)
            alone = _scan(load, freq)
            if alone > j_before * (1 - tolerance):
                layout[:, :], load[:, :] = saved_layout, saved_load
                gpu_mean[:], freq[:] = saved_mean, saved_freq
                improving[:] = False
            else:
                after = alone
                made = best_price[f1]
    else:
        for f in range(focus):
            if improving[f]:
                made += best_price[f]
    left[r] -= made
    before[r] = after
    return bool(improving.any())


@_jit
def _first_best(mask: Any, value: Any) -> int:
    """np.argmax(np.where(mask, value, -inf)): the first of the largest."""
    at, top = 0, -np.inf
    for i in range(mask.size):
        v = value[i] if mask[i] else -np.inf
        if v > top:
            at, top = i, v
    return at


@_jit
def _apply_best(
    layout: Any,
    load: Any,
    gpu_mean: Any,
    zl: Any,
    heavy: Any,
    rest: Any,
    pick: Any,
    q: int,
    f: int,
    slots: int,
) -> None:
    m, rem = divmod(q, slots * slots)
    sa, sb = divmod(rem, slots)
    _exchange(layout, load, gpu_mean, zl, heavy[f], rest[pick[f, m]], sa, sb)


@_jit
def lpt_fill(
    order: Any,  # [B, I] int64: items, heaviest first
    sorted_w: Any,  # [B, I] float64: their weights
    sorted_e: Any,  # [B, I] int64: their experts
    domain: Any,  # [G] int64
    num_domains: int,
    num_experts: int,
    slots: int,
    layout: Any,  # [B, G, S] int64, filled in place
) -> None:
    """packing.lpt's greedy: each copy onto the lightest GPU with room, avoiding GPUs whose
    domain holds its expert while any other has room."""
    rows, num_items = order.shape
    num_gpus = domain.size
    gpu_load = np.zeros(num_gpus)
    fill = np.zeros(num_gpus, dtype=np.int64)
    present = np.zeros((num_domains, num_experts), dtype=np.bool_)
    for r in range(rows):
        gpu_load[:] = 0.0
        fill[:] = 0
        present[:, :] = False
        for step in range(num_items):
            e = sorted_e[r, step]
            gpu, low = -1, np.inf  # the first of the lightest with room (weights are finite)
            for g in range(num_gpus):
                if fill[g] >= slots:
                    continue
                key = gpu_load[g] + 1e300 if present[domain[g], e] else gpu_load[g]
                if gpu < 0 or key < low:
                    gpu, low = g, key
            layout[r, gpu, fill[gpu]] = order[r, step]
            fill[gpu] += 1
            gpu_load[gpu] += sorted_w[r, step]
            present[domain[gpu], e] = True


def warm() -> bool:
    """Compile (or load from numba's cache) now, on a toy through the planner's own entry points,
    rather than inside the first plan; for set-up scripts. Returns whether the loops are there."""
    if not AVAILABLE:
        return False
    from .packing import Bins, lpt  # here, not at the top: both import this module
    from .search import pair_refine

    bins = Bins(2, 2, np.arange(2))
    weight = np.array([[4.0, 3.0, 2.0, 1.0]])
    expert = np.arange(4)[None]
    pair_refine(weight[:, :, None], expert, 4, bins, lpt(weight, expert, 4, bins))
    return True
