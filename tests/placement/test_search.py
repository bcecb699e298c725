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
