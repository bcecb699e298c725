"""Packing: never worse than longest-processing-time greedy on what it is fitted on; exact where small."""

import itertools

import numpy as np
import pytest

from moe_placement.packing import Bins, gpu_totals, lpt
from moe_placement.replicate import expand, greedy_counts
from moe_placement.search import expected_peak, gpu_scenario_loads, pair_refine
from moe_placement.solve import item_loads, solve_rows


def _rows(seed: int, rows: int, experts: int, gpus: int, slots: int, scen: int = 1) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    mean = rng.gamma(0.4, 1.0, size=(rows, experts)) + 1e-3
    scenarios = (
        mean[:, None, :] * rng.lognormal(0.0, 0.4, size=(rows, scen, experts))
        if scen > 1
        else mean[:, None, :]
    )
    counts = greedy_counts(mean, gpus * slots, gpus)
    expert = expand(counts)
    return mean, scenarios, counts, expert


@pytest.mark.parametrize(("experts", "gpus", "slots"), [(32, 8, 5), (20, 12, 2), (64, 8, 9), (60, 16, 4)])
def test_exchanges_never_lose_to_lpt_on_the_mean_and_never_raise_the_objective(
    experts: int, gpus: int, slots: int
) -> None:
    mean, scen, counts, expert = _rows(experts + gpus, 12, experts, gpus, slots, scen=6)
    bins = Bins(gpus, slots, np.arange(gpus))
    weight = np.take_along_axis(mean / counts, expert, axis=1)
    start = lpt(weight, expert, experts, bins)
    on_mean = pair_refine(weight[:, :, None], expert, experts, bins, start)
    assert (gpu_totals(weight, on_mean).max(axis=1) <= gpu_totals(weight, start).max(axis=1) + 1e-12).all()
    loads = item_loads(scen, counts, expert)
    hedged = pair_refine(loads, expert, experts, bins, start)
    before = expected_peak(gpu_scenario_loads(loads, start))
    after = expected_peak(gpu_scenario_loads(loads, hedged))
    assert (after <= before * (1 + 1e-6)).all() and (after < before).any()
    for out in (on_mean, hedged):  # every copy exactly once, never two copies of an expert on one GPU
        assert (np.sort(out.reshape(out.shape[0], -1), axis=1) == np.arange(gpus * slots)).all()
        per_gpu = np.take_along_axis(expert, out.reshape(out.shape[0], -1), axis=1).reshape(out.shape)
        assert all(len(set(g)) == slots for row in per_gpu.tolist() for g in row)


def _best_pairing(items: np.ndarray, experts: np.ndarray) -> float:
    """Brute force: the smallest possible largest pair sum, two items per GPU, never one expert twice."""
    if items.size == 2:
        return float(items.sum()) if experts[0] != experts[1] else np.inf
    best = np.inf
    for k in range(1, items.size):
        if experts[k] == experts[0]:
            continue
        rest = np.delete(np.arange(items.size), [0, k])
        best = min(best, max(items[0] + items[k], _best_pairing(items[rest], experts[rest])))
    return float(best)


@pytest.mark.parametrize("seed", range(12))
def test_two_slots_per_gpu_is_exact_for_the_copies(seed: int) -> None:
    """LPT with two slots per GPU pairs largest with smallest, which is optimal (and exchanges keep it)."""
    mean, _, counts, expert = _rows(seed, 1, 7, 5, 2)
    bins = Bins(5, 2, np.arange(5))
    weight = np.take_along_axis(mean / counts, expert, axis=1)
    out = pair_refine(weight[:, :, None], expert, 7, bins, lpt(weight, expert, 7, bins))
    assert gpu_totals(weight, out).max() == pytest.approx(_best_pairing(weight[0], expert[0]))


@pytest.mark.parametrize("seed", range(6))
def test_one_slot_per_gpu_copies_are_optimal(seed: int) -> None:
    """With one slot per GPU a GPU's load is its expert's load per copy; greedy copies minimise the largest."""
    rng = np.random.default_rng(seed)
    mean = rng.gamma(0.5, 1.0, size=(1, 5)) + 1e-3
    sol = solve_rows(mean, mean[:, None, :], Bins(9, 1, np.arange(9)), cap=9)
    got = (
        mean[0][sol.expert[0, :, 0]] / np.bincount(sol.expert[0, :, 0], minlength=5)[sol.expert[0, :, 0]]
    ).max()
    best = min((mean[0] / np.array(c)).max() for c in itertools.product(range(1, 6), repeat=5) if sum(c) == 9)
    assert got == pytest.approx(best)


def test_tiny_rows_try_every_copy_vector() -> None:
    """The toy case from the facts: greedy copies cannot reach the optimum, every vector does."""
    toy = np.array([[600.0, 560, 120, 120, 20, 10, 10, 10]])
    sol = solve_rows(toy, toy[:, None, :], Bins(8, 2, np.arange(8)), cap=8)
    counts = np.bincount(sol.expert.ravel(), minlength=8)
    per_copy = toy[0] / counts
    assert per_copy[sol.expert[0]].sum(axis=1).max() == pytest.approx(590 / 3)  # DeepSeek's greedy: 232


def test_an_exchange_is_priced_at_the_copies_it_makes_gpus_load() -> None:
    """With ``held``, the search's budget counts copies loaded (metrics.gpu_moves): moving a copy on
    or back home loads fewer than the two a fresh exchange loads. Checked against gpu_moves itself."""
    from moe_placement.metrics import gpu_moves
    from moe_placement.search import _loads_added

    rng = np.random.default_rng(5)
    gpus, slots, experts = 6, 2, 12
    original = rng.permutation(experts)  # one copy each: a GPU never holds an expert twice
    held = np.zeros((1, gpus, experts), dtype=bool)
    held[0, np.arange(experts) // slots, original] = True
    current = original.copy()
    current[[0, 2]] = current[[2, 0]]  # an earlier exchange: GPUs 0 and 1 each loaded one copy
    checked = set()
    for heavy, partner, sa, sb in itertools.product(range(gpus), range(gpus), range(slots), range(slots)):
        if heavy == partner:
            continue
        layout = current.reshape(gpus, slots)
        ea = layout[heavy][None, None, :]  # [n, F, Sa]
        eb = layout[partner][None, None, None, :]  # [n, F, M, Sb]
        price = _loads_added(held, np.array([[heavy]]), np.array([[[partner]]]), ea, eb)[0, 0, 0, sa, sb]
        after = layout.copy()
        after[heavy, sa], after[partner, sb] = layout[partner, sb], layout[heavy, sa]
        moved = gpu_moves(original[None], after.reshape(1, -1), gpus) - gpu_moves(
            original[None], current[None], gpus
        )
        assert price == moved, (heavy, partner, sa, sb)
        checked.add(int(price))
    assert {-2, 0, 1, 2} <= checked  # -2: both moved copies go home and free their loads


@pytest.mark.parametrize("budget", [0, 1, 2, 5, 12])
def test_a_load_budget_bounds_the_copies_loaded_from_the_original(budget: int) -> None:
    from moe_placement.metrics import gpu_moves

    _, scenarios, counts, expert = _rows(11, 3, 40, 10, 4, scen=6)
    bins = Bins(10, 4, np.arange(10))
    loads = item_loads(scenarios, counts, expert)
    start = np.broadcast_to(np.arange(40).reshape(1, 10, 4), (3, 10, 4)).copy()
    held = np.zeros((3, 10, 40), dtype=bool)
    held[np.arange(3)[:, None], np.arange(40) // 4, expert] = True
    order = pair_refine(loads, expert, 40, bins, start, swaps=np.full(3, budget), held=held)
    out = np.take_along_axis(expert, order.reshape(3, -1), axis=1)
    for r in range(3):
        assert gpu_moves(expert[r : r + 1], out[r : r + 1], 10) <= budget
    if budget == 0:
        np.testing.assert_array_equal(out, expert)
    peak = [expected_peak(gpu_scenario_loads(item_loads(scenarios, counts, f), start)) for f in (expert, out)]
    assert (peak[1] <= peak[0] * (1 + 1e-12)).all()


def test_a_spent_budget_still_takes_exchanges_that_load_nothing() -> None:
    """With ``held`` and nothing left to spend, a copy that was moved onto the busiest GPU still goes
    back home (it frees two loads), instead of the search stopping at zero."""
    from moe_placement.metrics import gpu_moves

    load = np.array([4.0, 1.0, 3.0, 2.0, 2.5, 2.5, 1.0, 4.0])  # held: every GPU at 5
    original = np.arange(8)
    start = original.copy()
    start[[0, 2]] = start[[2, 0]]  # an earlier exchange: GPU 1 now carries 6
    held = np.zeros((1, 4, 8), dtype=bool)
    held[0, np.arange(8) // 2, original] = True
    layout = np.arange(8).reshape(1, 4, 2)
    item_load = load[start][None, :, None]
    order = pair_refine(
        item_load, start[None], 8, Bins(4, 2, np.arange(4)), layout, swaps=np.zeros(1), held=held
    )
    out = np.take_along_axis(start[None], order.reshape(1, -1), axis=1)
    assert gpu_moves(original[None], out, 4) == 0
    assert expected_peak(gpu_scenario_loads(item_load, order))[0] == pytest.approx(5.0)


def test_inside_a_node_domain_no_gpu_takes_a_second_copy_of_an_expert() -> None:
    """Static dispatch over nodes: the conflict domain is the node, and a map from elsewhere may hold
    an expert on two GPUs of one node. Swapping those two experts between those GPUs keeps the node's
    experts, and ``held`` would price it at 0, yet each GPU would then hold one expert twice and load
    a copy (found by a review probe: a spent budget kept taking such exchanges)."""
    from moe_placement.metrics import gpu_moves

    expert = np.array([0, 1, 2, 0, 1, 3, 4, 5, 2, 4, 5, 3])  # 4 GPUs x 3 slots; node 0 = GPUs 0 and 1
    per_expert = np.array([4.0, 1.0, 6.0, 0.5, 1.0, 1.0])
    item_load = (per_expert[expert] / 2)[None, :, None]
    held = np.zeros((1, 4, 6), dtype=bool)
    held[0, np.arange(12) // 3, expert] = True
    start = np.arange(12).reshape(1, 4, 3)
    for budget in (0, 2, 8):
        order = pair_refine(
            item_load,
            expert[None],
            6,
            Bins(4, 3, np.array([0, 0, 1, 1])),
            start,
            swaps=np.full(1, budget),
            held=held,
        )
        out = np.take_along_axis(expert[None], order.reshape(1, -1), axis=1).reshape(4, 3)
        assert all(len(set(gpu)) == 3 for gpu in out.tolist()), out
        assert gpu_moves(expert[None], out.reshape(1, -1), 4) <= budget


def _hedged_rows(seed: int, rows: int) -> tuple[np.ndarray, ...]:
    """Rows of 40 experts on 12 GPUs x 4 slots with 9 scenarios: item loads, experts, counts, LPT start."""
    mean, scen, counts, expert = _rows(seed, rows, 40, 12, 4, scen=9)
    bins = Bins(12, 4, np.arange(12))
    start = lpt(np.take_along_axis(mean / counts, expert, axis=1), expert, 40, bins)
    return item_loads(scen, counts, expert), expert, counts, bins, start


def test_a_row_whose_candidates_agree_is_searched_once_with_the_same_result() -> None:
    """refine_distinct searches one of two equal candidates and copies it: the same layouts as
    searching both (rows are independent; the pairing width follows the rows still searching)."""
    from moe_placement.solve import refine_distinct

    loads, expert, counts, bins, start = _hedged_rows(5, 6)
    out = refine_distinct(
        *(np.repeat(a, 2, axis=0) for a in (loads, expert, counts)), 40, bins, np.repeat(start, 2, axis=0), 2
    )
    assert (out == np.repeat(pair_refine(loads, expert, 40, bins, start), 2, axis=0)).all()


def test_fewer_rounds_stop_the_same_search_earlier() -> None:
    """``rounds`` cuts the search short: 0 rounds leave the start, and J after a few rounds lies
    between the start's and the full search's (the same trajectory, stopped)."""
    loads, expert, _, bins, start = _hedged_rows(9, 5)

    def cost(lay: np.ndarray) -> np.ndarray:
        return expected_peak(gpu_scenario_loads(loads, lay))

    assert (pair_refine(loads, expert, 40, bins, start, rounds=0) == start).all()
    few = cost(pair_refine(loads, expert, 40, bins, start, rounds=3))
    full = cost(pair_refine(loads, expert, 40, bins, start))
    assert (full <= few + 1e-12).all() and (few <= cost(start) + 1e-12).all()


def test_the_exchange_cost_sums_scenarios_exactly() -> None:
    """The search's mean over scenarios (einsum on float64) is the same number as numpy's mean: float32
    loads of one magnitude sum exactly in float64, whatever the order (plans depend on ties)."""
    from moe_placement.search import _exchange_cost

    rng = np.random.default_rng(3)
    n, items, scen, focus, slots = 3, 48, 45, 6, 4
    zl = (rng.gamma(0.5, 1.0, size=(n, items, scen)) / 300).astype(np.float32)
    a_items = rng.integers(0, items, size=(n, focus, slots))
    b_items = rng.integers(0, items, size=(n, focus, 1, slots))
    lh, lp = (
        (rng.random((n, focus, scen)) / 50).astype(np.float32),
        (rng.random((n, focus, 1, scen)) / 80).astype(np.float32),
    )
    floor = (rng.random((n, scen)) / 60).astype(np.float32)
    got = _exchange_cost(zl, a_items, b_items, lh, lp, floor)
    za = zl[np.arange(n)[:, None, None], a_items]
    zb = zl[np.arange(n)[:, None, None, None], b_items]
    delta = zb[:, :, :, None, :, :] - za[:, :, None, :, None, :]
    peak = np.maximum(
        np.maximum(lh[:, :, None, None, None, :] + delta, lp[:, :, :, None, None, :] - delta),
        floor[:, None, None, None, None, :],
    )
    assert (got == peak.mean(axis=5, dtype=np.float64)).all()


@pytest.mark.parametrize(
    ("experts", "gpus", "slots", "domains", "scen"),
    [
        (32, 8, 5, 8, 6),
        (64, 16, 4, 4, 23),
        (60, 12, 6, 3, 45),
        (40, 10, 4, 10, 1),
        (288, 72, 4, 9, 12),
        (288, 72, 4, 9, 1),
        (288, 72, 4, 9, 20),
    ],  # the last two leave GPUs out of every pair: a floor
)
def test_screening_picks_the_exchange_that_scoring_every_one_picks(
    experts: int, gpus: int, slots: int, domains: int, scen: int
) -> None:
    """Random rounds (shared conflict domains, with and without a floor): wherever full scoring finds
    an exchange that counts as progress, the screened search finds the same one with the same gain,
    and it never reports progress where full scoring finds none; with a move budget, wherever an
    exchange ranks at all, the same one, gain, score and price."""
    from moe_placement import search as s

    _, scenarios, counts, expert = _rows(experts * gpus + scen, 24, experts, gpus, slots, scen=scen)
    bins = Bins(gpus, slots, np.arange(gpus) // (gpus // domains))
    loads = item_loads(scenarios, counts, expert).astype(np.float32)
    rng = np.random.default_rng(7)
    layout = np.stack([rng.permutation(gpus * slots).reshape(gpus, slots) for _ in range(loads.shape[0])])
    load = gpu_scenario_loads(loads, layout)
    before = expected_peak(load)
    reach = s.TOLERANCE * np.maximum(before, 1e-30)[:, None]
    compared = floors = budgeted = 0
    for rnd in range(6):  # different pairings, and so different floors
        pair = s._round_pairs(load, layout, expert, bins, experts, rnd)
        floors += int(not np.isneginf(pair.floor).all())
        shape = (*pair.b_items.shape, slots)
        valid = s._allowed(pair, s._Picks.of(np.arange(int(np.prod(shape))), pair)).reshape(shape)
        full, full_gain, _, _ = s._best_exchanges(
            loads, pair.a_items, pair.b_items, pair.lh, pair.lp, pair.floor, valid, pair.current, None,
            np.zeros(loads.shape[0], dtype=np.int64),
        )  # fmt: skip
        screened, gain, _, _ = s._screened_exchanges(loads, loads.mean(axis=2), pair, before)
        counts_progress = full_gain > reach
        assert np.array_equal(screened[counts_progress], full[counts_progress])
        assert np.array_equal(gain[counts_progress], full_gain[counts_progress])
        assert not (gain[~counts_progress] > reach.repeat(gain.shape[1], axis=1)[~counts_progress]).any()
        compared += int(counts_progress.sum())
        # with a budget: random prices (-2..2 copies loaded) and budgets, ranked by gain per copy
        price = rng.integers(-2, 3, size=(loads.shape[0], pair.heavy.shape[1], int(np.prod(shape[2:]))))
        left = rng.integers(0, 3, size=loads.shape[0])
        full, full_gain, full_score, full_price = s._best_exchanges(
            loads, pair.a_items, pair.b_items, pair.lh, pair.lp, pair.floor, valid, pair.current, price, left
        )
        screened, gain, score, paid = s._screened_exchanges(
            loads, loads.mean(axis=2), pair, before, price, left
        )
        ranked = np.isfinite(full_score)
        assert np.array_equal(ranked, np.isfinite(score))
        for got, want in ((screened, full), (gain, full_gain), (score, full_score), (paid, full_price)):
            assert np.array_equal(got[ranked], want[ranked])
        budgeted += int(ranked.sum())
    assert compared > 0 and budgeted > 0
    assert (floors > 0) == (gpus == 72)  # small rows pair every GPU; 72 GPUs leave some out
