"""Improve a packing against plausible futures: parallel swaps between pairs of GPUs.

The engine pays, at every step, for its busiest GPU, so the objective of a packing is the
mean over scenarios (plausible next-window steps) of the busiest GPU's load:
``J = mean_k max_g L[k, g]``. Hedging is what this buys over packing the mean: experts
that spike together (one traffic domain's hot experts, co-activated experts) end up on
different GPUs, experts that offset each other share one.

One round pairs the GPUs that are most often the bottleneck with the ones that are least
often (a different pairing each round), and finds for every pair the best exchange of one
copy each, judged exactly on J with all other GPUs fixed (the largest load outside the
pair comes from each scenario's top three). All pairs are disjoint, so their exchanges are
applied together; a row whose J did not fall keeps only its single best exchange, which
is exact. J therefore never rises, and the result is never worse than the start (e.g.
longest-processing-time greedy).

Scoring every exchange on every scenario is most of the work, and most exchanges cannot
lower a pair's J by the least that counts as progress: a mean of maxima is at least the
maximum of the means, so the scenario means bound each exchange's gain, and only those the
bound does not rule out (about one in six at DeepSeek-V3 shape) are scored exactly. The best
exchange, and so every plan, is the same as scoring all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import compiled
from .layout import BoolArray, FloatArray, IntArray
from .packing import Bins

AnyFloat = npt.NDArray[Any]  # float64, or float32 inside the search (half the memory traffic)

TOLERANCE = 1e-7  # relative drop of J below which an exchange counts as no progress
PATIENCE = 2  # a row stops after this many rounds (pairings) without an exchange, on one scenario
# on several scenarios the objective is a mean of maxima: an exchange pays only where its GPU is
# the bottleneck, so pairings without one are common long before the search is done
PATIENCE_SCENARIOS = 5
MAX_PARTNERS = 6  # GPUs each focus GPU may exchange with in one round
MIN_FOCUS = 8  # GPUs that try an exchange in each round, at least
MAX_ROUNDS = 32  # on one scenario
MAX_ROUNDS_SCENARIOS = 100
# an exchange's bound on its gain (from scenario means) may exceed the exact gain by float32
# rounding (1.8e-7 of J measured at V3 shape); screening keeps every exchange within this of the best
SCREEN_SLACK = 1e-5
CHUNK = 1 << 18  # elements of one block of the exchange search's [rows, F, M, Sa, Sb, K] arrays
PRICE_FLOOR = (
    1.0  # with a move budget, an exchange ranks by gain / max(copies it loads, this): two-load ones at half
)


def on_grid(item_load: AnyFloat) -> AnyFloat:
    """float32 loads, each row's rounded to multiples of one power of two (2**-24 of its largest
    power of two): every float64 sum the search takes of them is then exact in any order, so
    numpy's pairwise sums and the compiled loops' running sums agree, whatever the loads' spread.
    Non-finite loads are refused."""
    out = np.asarray(item_load, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ValueError("pair_refine: item loads must be finite")
    top = np.abs(out).max(axis=tuple(range(1, out.ndim)), initial=0.0)
    step = np.ldexp(1.0, np.frexp(top)[1] - 24).reshape(-1, *([1] * (out.ndim - 1)))
    snapped: AnyFloat = (np.round(out / step) * step).astype(np.float32)
    return snapped


def gpu_scenario_loads(item_load: AnyFloat, layout: IntArray) -> AnyFloat:
    """Per-scenario GPU loads [B, G, K] of a layout [B, G, S] for item loads [B, I, K] (scenarios last)."""
    rows = layout.shape[0]
    out: AnyFloat = item_load[np.arange(rows)[:, None, None], layout].sum(axis=2)
    return out


def expected_peak(gpu_load: AnyFloat) -> FloatArray:
    """J per row: mean over scenarios of the busiest GPU's load; gpu_load [B, G, K] -> [B]."""
    out: FloatArray = gpu_load.max(axis=1).mean(axis=1, dtype=np.float64)
    return out


def pair_refine(
    item_load: FloatArray,
    item_expert: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    swaps: IntArray | None = None,
    held: BoolArray | None = None,
    rounds: int | None = None,
) -> IntArray:
    """Lower J by exchanging copies between GPUs. item_load [B, I, K] (scenarios last), layout [B, G, S] item ids.

    ``swaps`` [B]: at most this many exchanges per row (each moves two copies); None: no limit.
    With ``held`` [B, G, E] (which experts each GPU held before any move), ``swaps`` counts copies
    loaded instead: an exchange costs the copies its two GPUs hold beyond what they held (0-2 more,
    fewer when it moves a copy on or back), and each GPU takes its best exchange per copy loaded;
    once the budget is spent, exchanges that load nothing more are still taken.
    ``rounds``: at most this many rounds (default MAX_ROUNDS, or MAX_ROUNDS_SCENARIOS on several scenarios).
    """
    rows, num_gpus, slots = layout.shape
    if num_gpus < 2 or rows == 0:
        return layout
    item_load = on_grid(item_load)
    several = item_load.shape[2] > 1
    patience, max_rounds = (PATIENCE_SCENARIOS, MAX_ROUNDS_SCENARIOS) if several else (PATIENCE, MAX_ROUNDS)
    max_rounds = max_rounds if rounds is None else min(max_rounds, rounds)
    left = (
        np.full(rows, np.iinfo(np.int64).max) if swaps is None else np.array(swaps, dtype=np.int64, ndmin=1)
    )
    if left.shape != (rows,):
        raise ValueError(f"pair_refine: swaps has shape {left.shape}, expected ({rows},)")
    held = None if held is None else np.asarray(held, dtype=bool)
    layout = layout.copy()
    # with ``held``, an exchange that moves copies on or back home loads none (or frees some):
    # a spent budget still allows those, so a row stops for want of exchanges, not at zero
    stop_at = 0 if held is None else -1
    if compiled.ENABLED:
        return _compiled_rounds(item_load, item_expert, num_experts, bins, layout, left, held, swaps is not None,
                                patience, max_rounds, stop_at)  # fmt: skip
    idle = np.zeros(rows, dtype=np.int64)  # consecutive rounds without an exchange
    # the rows still searching, their layouts, item loads and GPU loads; compacted when a row
    # stops (gathering [B, I, K] item loads every round cost as much as a round's search)
    idx = np.flatnonzero(left > stop_at)
    sub = layout[idx]
    zl = item_load[idx]
    zmean = zl.mean(axis=2, dtype=np.float64)  # [n, I]: bounds the exchanges' gains
    zl_expert = item_expert[idx]
    load = gpu_scenario_loads(zl, sub)  # [n, G, K]
    before = expected_peak(load)  # J of each working row, carried from round to round
    for rnd in range(max_rounds):
        if idx.size == 0:
            break
        n = idx.size
        pair = _round_pairs(load, sub, zl_expert, bins, num_experts, rnd)
        heavy, partner, a_items, b_items = pair.heavy, pair.partner, pair.a_items, pair.b_items
        price = (
            None
            if held is None
            else _loads_added(held[idx], heavy, partner, pair.ea, pair.eb).reshape(n, heavy.shape[1], -1)
        )
        best, best_gain, best_score, best_price = _screened_exchanges(
            zl, zmean, pair, before, price, left[idx]
        )
        m_idx, rem = np.divmod(best, slots * slots)
        sa, sb = np.divmod(rem, slots)
        improving = (best_gain > TOLERANCE * np.maximum(before[:, None], 1e-30)) & np.isfinite(best_score)
        if swaps is not None:  # a row with a budget keeps its best exchanges (per copy loaded) only
            rank = np.argsort(-np.where(improving, best_score, -np.inf), axis=1, kind="stable")
            spend = np.cumsum(np.take_along_axis(np.maximum(best_price, 0) * improving, rank, axis=1), axis=1)
            fits = np.empty_like(improving)
            np.put_along_axis(fits, rank, spend <= left[idx, None], axis=1)
            improving &= fits
        trial, trial_load = sub.copy(), load.copy()
        rr, ff = np.nonzero(improving)
        _apply(trial, trial_load, zl, heavy, partner, a_items, b_items, rr, ff, m_idx, sa, sb)
        after = expected_peak(trial_load)
        worse = after > before * (1 - TOLERANCE)
        after[worse] = before[worse]
        redo = np.flatnonzero(worse & improving.any(axis=1))
        if worse.any():  # joint exchanges interfered: try the row's single best one alone
            trial[worse], trial_load[worse] = sub[worse], load[worse]
            if redo.size:
                f1 = np.argmax(np.where(improving[redo], best_gain[redo], -np.inf), axis=1)
                _apply(trial, trial_load, zl, heavy, partner, a_items, b_items, redo, f1, m_idx, sa, sb)
                alone = expected_peak(trial_load[redo])
                rises = alone > before[redo] * (1 - TOLERANCE)
                after[redo] = np.where(rises, before[redo], alone)
                still = redo[rises]
                trial[still], trial_load[still] = sub[still], load[still]  # J never rises
                worse[still] = True
                improving[still] = False
        progressed = improving.any(axis=1)
        single = np.zeros_like(improving)  # a row whose joint exchanges interfered made its best one alone
        if redo.size:
            single[redo, f1] = True
        made = (best_price * np.where(worse[:, None], single & improving, improving)).sum(axis=1)
        left[idx] -= made
        sub, load, before = trial, trial_load, after
        idle[idx] = np.where(progressed, 0, idle[idx] + 1)
        stop = (idle[idx] >= patience) | (left[idx] <= stop_at)
        if stop.any():
            layout[idx[stop]] = sub[stop]
            go = ~stop
            idx, sub, load, before = idx[go], sub[go], load[go], before[go]
            zl, zmean, zl_expert = zl[go], zmean[go], zl_expert[go]
    layout[idx] = sub
    return layout


def _compiled_rounds(
    item_load: FloatArray,
    item_expert: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    left: IntArray,
    held: BoolArray | None,
    budget: bool,
    patience: int,
    max_rounds: int,
    stop_at: int,
) -> IntArray:
    """The rounds below, compiled (compiled.py): the same layouts, about twice as soon at V3 shape.
    ``item_load``: on_grid's answer (fresh, writable float32: one numba specialisation)."""
    zl = item_load
    out = np.ascontiguousarray(layout, dtype=np.int64)
    rows, num_gpus, _ = out.shape
    if item_expert.shape != zl.shape[:2] or zl.shape[0] != rows or bins.num_gpus != num_gpus:
        raise ValueError(
            f"pair_refine: loads {zl.shape}, experts {item_expert.shape}, layout {out.shape} disagree"
        )
    if held is not None and held.shape != (rows, num_gpus, num_experts):
        raise ValueError(f"pair_refine: held {held.shape}, expected {(rows, num_gpus, num_experts)}")
    compiled.require_indices("pair_refine layout", out, zl.shape[1])
    compiled.require_indices("pair_refine experts", item_expert, num_experts)
    compiled.require_indices("pair_refine domains", bins.domain, bins.num_domains)
    compiled.refine_rounds(
        zl,
        zl.mean(axis=2, dtype=np.float64),
        np.array(item_expert, dtype=np.int64),
        np.array(bins.domain, dtype=np.int64),
        bins.num_domains,
        num_experts,
        out,
        np.ascontiguousarray(gpu_scenario_loads(zl, out)),
        left,
        np.zeros((rows, 1, 1), dtype=np.bool_) if held is None else np.array(held, dtype=np.bool_),
        held is not None,
        budget,
        patience,
        max_rounds,
        stop_at,
        np.array([TOLERANCE, SCREEN_SLACK, MIN_FOCUS, MAX_PARTNERS, PRICE_FLOOR]),
    )
    return out.astype(layout.dtype, copy=False)


def _pairs(load: AnyFloat, rnd: int) -> tuple[IntArray, IntArray, IntArray, AnyFloat]:
    """Focus GPUs [n, F] (the bottleneck in some scenario, then the heaviest on average) and their
    partners [n, F, M] (the lightest, a different pairing each round; all disjoint); also the
    GPUs in no pair [n, U] and each GPU's mean load [n, G]."""
    n, num_gpus, _ = load.shape
    nl = np.arange(n)
    peak = load.argmax(axis=1)  # [n, K]
    freq = np.bincount((nl[:, None] * num_gpus + peak).ravel(), minlength=n * num_gpus).reshape(n, num_gpus)
    mean = load.mean(axis=2, dtype=np.float64)
    crit = freq + mean / np.maximum(mean.max(axis=1, keepdims=True), 1e-30)
    order = np.argsort(-crit, axis=1, kind="stable")
    # at least MIN_FOCUS GPUs move at once: with few scenarios (the mean alone) the heaviest
    # GPUs must come down together, or each round only shaves the single busiest one
    focus = int(min(num_gpus // 2, max(MIN_FOCUS, (freq > 0).sum(axis=1).max())))
    per = max(1, min(MAX_PARTNERS, (num_gpus - focus) // focus))
    heavy = order[:, :focus]
    rest = order[:, focus:][:, ::-1]  # lightest first
    pick = (np.arange(focus)[:, None] + focus * np.arange(per)[None, :] + rnd) % (num_gpus - focus)
    partner: IntArray = rest[:, pick]
    paired = np.zeros(num_gpus - focus, dtype=bool)
    paired[pick] = True
    alone = np.flatnonzero(~paired)  # the same columns of every row
    return heavy, partner, rest[:, alone], mean


@dataclass(frozen=True)
class _Pairs:
    """One round's pairs: focus GPUs [n, F], partners [n, F, M], their copies and loads."""

    heavy: IntArray
    partner: IntArray
    a_items: IntArray  # [n, F, S]
    b_items: IntArray  # [n, F, M, S]
    ea: IntArray  # experts of a_items
    eb: IntArray  # experts of b_items
    lh: AnyFloat  # [n, F, K]
    lp: AnyFloat  # [n, F, M, K]
    floor: AnyFloat  # [n, K], -inf where every GPU is in a pair
    current: FloatArray  # [n, F, M]: J of each pair before any exchange
    gpu_mean: AnyFloat  # [n, G]: each GPU's mean load over scenarios
    present: IntArray  # [n, D * E]: copies of each expert in each conflict domain
    domain: IntArray  # [G]
    shared: bool  # some domain holds several GPUs


def _round_pairs(
    load: AnyFloat, sub: IntArray, sub_expert: IntArray, bins: Bins, num_experts: int, rnd: int
) -> _Pairs:
    """The round's pairs of GPUs, what each holds and the floor under them (layouts sub [n, G, S])."""
    n, num_gpus, slots = sub.shape
    nl = np.arange(n)
    heavy, partner, alone, gpu_mean = _pairs(load, rnd)  # [n, F], [n, F, M], [n, U]
    a_items = sub[nl[:, None], heavy]  # [n, F, S]
    b_items = sub[nl[:, None, None], partner]  # [n, F, M, S]
    lh = load[nl[:, None], heavy]  # [n, F, K]
    lp = load[nl[:, None, None], partner]  # [n, F, M, K]
    # the floor: busiest GPU outside every focus GPU and partner (they all move this round)
    if alone.shape[1] == 0:  # every GPU in some pair (F = G/2): no floor
        floor = np.full((n, load.shape[2]), -np.inf, dtype=load.dtype)
    else:
        floor = load[nl[:, None], alone].max(axis=1)  # [n, K]
    num_dom = bins.num_domains
    slot_dom = np.repeat(bins.domain, slots)
    keys = (nl[:, None] * num_dom + slot_dom[None, :]) * num_experts + sub_expert[
        nl[:, None], sub.reshape(n, -1)
    ]
    present = np.bincount(keys.ravel(), minlength=n * num_dom * num_experts).reshape(n, num_dom * num_experts)
    current = np.maximum(np.maximum(lh[:, :, None, :], lp), floor[:, None, None, :]).mean(
        axis=3, dtype=np.float64
    )
    ea = sub_expert[nl[:, None, None], a_items]
    eb = sub_expert[nl[:, None, None, None], b_items]
    return _Pairs(heavy, partner, a_items, b_items, ea, eb, lh, lp, floor, current, gpu_mean, present,
                  bins.domain, num_dom < num_gpus)  # fmt: skip


@dataclass(frozen=True)
class _Picks:
    """Some exchanges of a round, by flat index q over [n, F, M, Sa, Sb], split into what indexes them."""

    row: IntArray
    pf: IntArray  # row * F + focus: indexes [n, F] arrays flat, and [n, F, K] by row
    pm: IntArray  # pf * M + partner: [n, F, M]
    sa: IntArray
    sb: IntArray

    @classmethod
    def of(cls, q: IntArray, pair: _Pairs) -> _Picks:
        _, focus, per, slots = pair.b_items.shape
        pm, rem = np.divmod(q, slots * slots)
        sa, sb = np.divmod(rem, slots)
        pf = pm // per
        return cls(pf // focus, pf, pm, sa, sb)


def _allowed(pair: _Pairs, x: _Picks) -> BoolArray:
    """May each focus GPU give its copy sa for its partner's copy sb?

    A copy may not join a conflict domain that already holds its expert (unless both GPUs share
    the domain), and inside a shared domain a GPU still takes no second copy of an expert.
    """
    slots = pair.a_items.shape[2]
    num_experts = pair.present.shape[1] // (int(pair.domain.max()) + 1)
    ea = pair.ea.ravel()[x.pf * slots + x.sa]
    eb = pair.eb.ravel()[x.pm * slots + x.sb]
    dom_h = pair.domain[pair.heavy.ravel()[x.pf]]
    dom_p = pair.domain[pair.partner.ravel()[x.pm]]
    base = x.row * pair.present.shape[1]
    present = pair.present.ravel()
    a_ok = present[base + dom_p * num_experts + ea] == 0
    b_ok = present[base + dom_h * num_experts + eb] == 0
    same = dom_h == dom_p
    out: BoolArray = (ea != eb) & (same | (a_ok & b_ok))
    if pair.shared:  # GPUs of one domain (across domains, a_ok and b_ok keep these apart already)
        at = np.flatnonzero(out & same)
        p_has = (pair.eb.reshape(-1, slots)[x.pm[at]] == ea[at, None]).any(axis=1)  # the partner holds a
        h_has = (pair.ea.reshape(-1, slots)[x.pf[at]] == eb[at, None]).any(axis=1)  # the heavy GPU holds b
        out[at] &= ~p_has & ~h_has
    return out


def _screened_exchanges(
    zl: AnyFloat,
    zmean: AnyFloat,
    pair: _Pairs,
    before: FloatArray,
    price: IntArray | None = None,
    left: IntArray | None = None,
) -> tuple[IntArray, FloatArray, FloatArray, IntArray]:
    """_best_exchanges' answer at a fraction of the work.

    A mean of maxima is at least the maximum of the means, so scenario means bound each
    exchange's gain from above without touching its K scenarios. Only the allowed exchanges
    whose bound reaches the least gain that can matter are scored exactly (about one in six at
    V3 shape), and exactly as _exchange_cost scores them, so the best one is the same. Without
    a budget that least gain is the one that counts as progress; with one (``price`` [n, F, J]
    copies loaded, ``left`` [n] budget), an affordable exchange ranks by gain per copy loaded,
    and any positive gain ranks.
    """
    n, focus, per, slots = pair.b_items.shape
    nl = np.arange(n)
    ma = zmean[nl[:, None, None], pair.a_items]  # [n, F, Sa]
    mb = zmean[nl[:, None, None, None], pair.b_items]  # [n, F, M, Sb]
    md = mb[:, :, :, None, :] - ma[:, :, None, :, None]  # [n, F, M, Sa, Sb]
    bound = np.maximum(
        pair.gpu_mean[nl[:, None], pair.heavy][:, :, None, None, None] + md,
        pair.gpu_mean[nl[:, None, None], pair.partner][..., None, None] - md,
    )
    if not np.isneginf(pair.floor).all():
        bound = np.maximum(bound, pair.floor.mean(axis=1, dtype=np.float64)[:, None, None, None, None])
    current = pair.current[..., None, None]
    if price is None:
        reach = TOLERANCE * np.maximum(before, 1e-30)[:, None, None, None, None]
        kept = current - bound >= reach - SCREEN_SLACK * current
    else:
        assert left is not None
        kept = (current - bound >= -SCREEN_SLACK * current) & (
            price.reshape(bound.shape) <= left[:, None, None, None, None]
        )
    q = np.flatnonzero(kept)
    q = q[_allowed(pair, _Picks.of(q, pair))]
    gain = np.full(n * focus * per * slots * slots, -np.inf)
    gain[q] = _exact_gains(zl, pair, _Picks.of(q, pair))
    shaped = gain.reshape(n, focus, -1)
    score = (
        shaped if price is None else np.where(shaped > 0, shaped / np.maximum(price, PRICE_FLOOR), -np.inf)
    )
    best = np.argmax(score, axis=2)
    best_gain = np.take_along_axis(shaped, best[..., None], axis=2)[..., 0]
    best_score = np.take_along_axis(score, best[..., None], axis=2)[..., 0]
    best_price = (
        np.ones((n, focus), dtype=np.int64)
        if price is None
        else np.take_along_axis(price, best[..., None], axis=2)[..., 0]
    )
    return best, best_gain, best_score, best_price


def _exact_gains(zl: AnyFloat, pair: _Pairs, x: _Picks) -> FloatArray:
    """Exact gain of each exchange, as _exchange_cost scores it."""
    n, num_items, num_scen = zl.shape
    slots = pair.a_items.shape[2]
    rows = zl.reshape(n * num_items, num_scen)
    base = x.row * num_items
    za = np.take(rows, base + pair.a_items.ravel()[x.pf * slots + x.sa], axis=0)  # [X, K]
    delta = np.take(rows, base + pair.b_items.ravel()[x.pm * slots + x.sb], axis=0)
    delta -= za
    new_h = np.take(pair.lh.reshape(-1, num_scen), x.pf, axis=0)
    new_h += delta
    np.subtract(np.take(pair.lp.reshape(-1, num_scen), x.pm, axis=0), delta, out=delta)
    np.maximum(new_h, delta, out=new_h)
    if not np.isneginf(pair.floor).all():
        np.maximum(new_h, np.take(pair.floor, x.row, axis=0), out=new_h)
    cost = np.einsum("...k->...", new_h.astype(np.float64)) / num_scen
    out: FloatArray = pair.current.ravel()[x.pm] - cost
    return out


def _best_exchanges(  # the reference: every exchange scored (tests hold _screened_exchanges to it)
    zl: AnyFloat,
    a_items: IntArray,
    b_items: IntArray,
    lh: AnyFloat,
    lp: AnyFloat,
    floor: AnyFloat,
    valid: BoolArray,
    current: FloatArray,
    price: IntArray | None,
    left: IntArray,
) -> tuple[IntArray, FloatArray, FloatArray, IntArray]:
    """Per focus GPU [n, F]: its best exchange (flat index over partner, Sa, Sb), gain, score and price.

    Blocks of rows at a time: the [rows, F, M, Sa, Sb, K] intermediates then stay in cache
    (twice as fast as one pass over all rows); every value is the same as in one pass.
    """
    n, focus, per, slots = b_items.shape
    step = max(1, CHUNK // (focus * per * slots * slots * zl.shape[2]))
    best = np.empty((n, focus), dtype=np.int64)
    best_gain, best_score = np.empty((n, focus)), np.empty((n, focus))
    best_price = np.ones((n, focus), dtype=np.int64)
    for lo in range(0, n, step):
        c = slice(lo, lo + step)
        cost = _exchange_cost(zl[c], a_items[c], b_items[c], lh[c], lp[c], floor[c])
        gain = np.where(valid[c], current[c][..., None, None] - cost, -np.inf).reshape(
            cost.shape[0], focus, -1
        )
        score = gain
        if price is not None:
            affordable = price[c] <= left[c, None, None]
            score = np.where(affordable & (gain > 0), gain / np.maximum(price[c], PRICE_FLOOR), -np.inf)
        top = np.argmax(score, axis=2)
        best[c] = top
        best_gain[c] = np.take_along_axis(gain, top[..., None], axis=2)[..., 0]
        best_score[c] = np.take_along_axis(score, top[..., None], axis=2)[..., 0]
        if price is not None:
            best_price[c] = np.take_along_axis(price[c], top[..., None], axis=2)[..., 0]
    return best, best_gain, best_score, best_price


def _exchange_cost(
    zl: AnyFloat, a_items: IntArray, b_items: IntArray, lh: AnyFloat, lp: AnyFloat, floor: AnyFloat
) -> FloatArray:
    """J of each pair after each exchange [n, F, M, Sa, Sb]: mean over scenarios of the larger new
    load of the two GPUs, or the floor (the largest load outside every pair)."""
    n, num_items, num_scen = zl.shape
    rows = zl.reshape(n * num_items, num_scen)  # np.take of whole rows: twice as fast as fancy indexing
    base = np.arange(n) * num_items
    za = np.take(rows, base[:, None, None] + a_items, axis=0)  # [n, F, S, K]
    zb = np.take(rows, base[:, None, None, None] + b_items, axis=0)  # [n, F, M, S, K]
    delta = zb[:, :, :, None, :, :] - za[:, :, None, :, None, :]  # [n, F, M, Sa, Sb, K]
    new_h = lh[:, :, None, None, None, :] + delta
    np.subtract(lp[:, :, :, None, None, :], delta, out=delta)
    np.maximum(new_h, delta, out=new_h)
    if not np.isneginf(floor).all():  # every GPU in some pair (F = G/2): no floor
        np.maximum(new_h, floor[:, None, None, None, None, :], out=new_h)
    # the mean in float64: summing float32 loads of one magnitude in float64 is exact in any order,
    # so einsum's sum is the same number as mean's, at a third of the time
    out: FloatArray = np.einsum("...k->...", new_h.astype(np.float64)) / new_h.shape[5]
    return out


def _loads_added(held: BoolArray, heavy: IntArray, partner: IntArray, ea: IntArray, eb: IntArray) -> IntArray:
    """Copies loaded beyond what the GPUs held, added by each exchange [n, F, M, Sa, Sb] (-2..2)."""
    n = held.shape[0]
    nl = np.arange(n)
    h_a = held[nl[:, None, None], heavy[:, :, None], ea].astype(np.int64)  # [n, F, Sa]
    h_b = held[nl[:, None, None, None], heavy[:, :, None, None], eb].astype(np.int64)  # [n, F, M, Sb]
    p_a = held[nl[:, None, None, None], partner[..., None], ea[:, :, None, :]].astype(
        np.int64
    )  # [n, F, M, Sa]
    p_b = held[nl[:, None, None, None], partner[..., None], eb].astype(np.int64)  # [n, F, M, Sb]
    # the heavy GPU gives a and takes b, the partner the reverse
    out: IntArray = h_a[:, :, None, :, None] - h_b[:, :, :, None, :] + p_b[:, :, :, None, :] - p_a[..., None]
    return out


def _apply(
    layout: IntArray,
    load: AnyFloat,
    item_load: AnyFloat,
    heavy: IntArray,
    partner: IntArray,
    a_items: IntArray,
    b_items: IntArray,
    rr: IntArray,
    ff: IntArray,
    m_idx: IntArray,
    sa: IntArray,
    sb: IntArray,
) -> None:
    """In place: exchange the chosen copies (row rr, focus ff) and update the scenario loads."""
    if rr.size == 0:
        return
    m, a_s, b_s = m_idx[rr, ff], sa[rr, ff], sb[rr, ff]
    h, p = heavy[rr, ff], partner[rr, ff, m]
    ia, ib = a_items[rr, ff, a_s], b_items[rr, ff, m, b_s]
    layout[rr, h, a_s] = ib
    layout[rr, p, b_s] = ia
    dz = item_load[rr, ib] - item_load[rr, ia]  # [m, K]
    load[rr, h] += dz
    load[rr, p] -= dz
