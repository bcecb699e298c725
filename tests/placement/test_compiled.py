"""The compiled loops (compiled.py) give the numpy code's answers exactly: layouts, then plans.

Each case runs both ways in one process (``compiled.ENABLED`` switched off for numpy). Integer
loads make ties common, so first-of-equals choices are exercised, not only distinct gains.
"""

import numpy as np
import pytest

from moe_placement import compiled, plan_instances
from moe_placement.packing import Bins, lpt
from moe_placement.replicate import expand, greedy_counts
from moe_placement.search import pair_refine
from moe_placement.solve import item_loads


def test_numba_is_there_where_the_tests_run() -> None:
    # the dev install carries numba, so CI holds the compiled loops to numpy (not numpy to itself)
    assert compiled.AVAILABLE and compiled.ENABLED
    assert compiled.warm()


def _both(monkeypatch: pytest.MonkeyPatch, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(compiled, "ENABLED", False)
    slow = fn(*args, **kwargs)
    monkeypatch.setattr(compiled, "ENABLED", True)
    return slow, fn(*args, **kwargs)


def _case(seed: int) -> dict[str, object]:
    """Random rows: GPUs, slots, experts, scenarios, conflict domains, a move budget, held experts."""
    rng = np.random.default_rng(seed)
    gpus = int(rng.choice([2, 4, 8, 12, 16, 32]))
    slots = int(rng.choice([1, 2, 3, 4, 5]))
    experts = int(max(slots + 1, gpus * slots - rng.integers(0, gpus * slots // 2 + 1)))
    experts = min(experts, gpus * slots)
    scen = int(rng.choice([1, 3, 8, 23]))
    per_domain = int(rng.choice([d for d in (1, 2, 4) if gpus % d == 0]))
    rows = 5
    if seed % 3 == 0:  # integer loads: many exchanges tie
        mean = rng.integers(1, 6, size=(rows, experts)).astype(float)
        scenarios = mean[:, None, :] * rng.integers(0, 4, size=(rows, scen, experts))
    else:
        mean = rng.gamma(0.4, 1.0, size=(rows, experts)) + 1e-3
        scenarios = mean[:, None, :] * rng.lognormal(0.0, 0.4, size=(rows, scen, experts))
    counts = greedy_counts(mean, gpus * slots, gpus)
    expert = expand(counts)
    bins = Bins(gpus, slots, np.arange(gpus) // per_domain)
    weight = np.take_along_axis(mean / counts, expert, axis=1)
    case: dict[str, object] = {"weight": weight, "expert": expert, "experts": experts, "bins": bins}
    case["loads"] = item_loads(scenarios, counts, expert)
    if rng.integers(2):
        case["swaps"] = rng.integers(0, 12, size=rows)
        if rng.integers(2):  # budget in copies loaded, from a random earlier placement
            held = np.zeros((rows, gpus, experts), dtype=bool)
            earlier = rng.permuted(np.broadcast_to(expert, expert.shape).copy(), axis=1)
            for r in range(rows):
                held[r, np.repeat(np.arange(gpus), slots), earlier[r, : gpus * slots]] = True
            case["held"] = held
    return case


@pytest.mark.parametrize("seed", range(60))
def test_the_greedy_and_the_exchange_search_place_every_copy_as_numpy_does(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    c = _case(seed)
    bins = c["bins"]
    assert isinstance(bins, Bins)
    slow, fast = _both(monkeypatch, lpt, c["weight"], c["expert"], c["experts"], bins)
    np.testing.assert_array_equal(slow, fast)
    budget = {k: c[k] for k in ("swaps", "held") if k in c}
    slow, fast = _both(monkeypatch, pair_refine, c["loads"], c["expert"], c["experts"], bins, slow, **budget)
    np.testing.assert_array_equal(slow, fast)


@pytest.mark.parametrize("max_moves", [None, 40])
def test_plans_are_the_same_with_and_without_the_compiled_loops(
    monkeypatch: pytest.MonkeyPatch, max_moves: int | None
) -> None:
    rng = np.random.default_rng(7)
    layers, experts = 6, 64
    hot = rng.gamma(0.5, 1.0, size=(layers, experts))
    histories = {
        f"i{i}": rng.poisson(400 * hot[None] * rng.lognormal(0, 0.3, size=(6, layers, experts))).astype(float)
        for i in range(2)
    }
    steps = {
        n: rng.poisson(20 * hot[None] * rng.lognormal(0, 0.5, size=(16, layers, experts))) for n in histories
    }
    shape = {"num_gpus": 16, "num_nodes": 2, "num_redundant": 16, "num_groups": 4}
    slow, fast = _both(
        monkeypatch, plan_instances, histories, steps=steps, max_moves=max_moves, dispatch="static", **shape
    )
    first = fast["i0"].physical_to_logical_map
    for name in histories:
        np.testing.assert_array_equal(slow[name].physical_to_logical_map, fast[name].physical_to_logical_map)
        assert slow[name].moved_slots == fast[name].moved_slots
    # the second plan starts from the first instance's map: the capped repair path runs too
    slow, fast = _both(
        monkeypatch,
        plan_instances,
        histories,
        steps=steps,
        currents={n: first for n in histories},
        max_moves=max_moves,
        dispatch="static",
        **shape,
    )
    for name in histories:
        np.testing.assert_array_equal(slow[name].physical_to_logical_map, fast[name].physical_to_logical_map)


def test_without_a_writable_cache_the_loops_still_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    # a read-only image with no writable home: numba finds no cache locator and refuses cache=True
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # public since numba 0.66
    monkeypatch.setattr(impl, "_locator_classes", [])

    def double(x: float) -> float:
        return 2 * x

    jitted = compiled._jit(double)
    assert jitted(3.0) == 6.0 and jitted._cache.__class__.__name__ == "NullCache"


def test_an_index_out_of_range_is_refused_before_the_compiled_loops_see_it() -> None:
    # the loops do not check bounds: a bad item or expert id would read outside an array there
    c = _case(1)
    bins = c["bins"]
    assert isinstance(bins, Bins) and compiled.ENABLED
    start = lpt(c["weight"], c["expert"], c["experts"], bins)
    bad = start.copy()
    bad[0, 0, 0] = start.size  # no such copy
    with pytest.raises(ValueError, match="layout"):
        pair_refine(c["loads"], c["expert"], c["experts"], bins, bad)
    experts = np.array(c["expert"]).copy()
    experts[0, 0] = -1
    with pytest.raises(ValueError, match="experts"):
        lpt(c["weight"], experts, c["experts"], bins)


@pytest.mark.parametrize("spread", ["wide", "signed"])
def test_loads_of_any_spread_or_sign_give_the_same_layouts(
    monkeypatch: pytest.MonkeyPatch, spread: str
) -> None:
    # float64 sums of float32 loads 16 orders of magnitude apart round by summation order unless
    # the loads sit on one grid (search.on_grid); signed loads too
    for seed in range(150):
        rng = np.random.default_rng(seed)
        gpus, slots, scen = 4, 2, 16
        shape = (2, gpus * slots, scen)
        loads = 10.0 ** rng.uniform(-10, 6, size=shape) if spread == "wide" else rng.normal(0, 3, size=shape)
        expert = np.tile(np.arange(gpus * slots), (2, 1))
        bins = Bins(gpus, slots, np.arange(gpus))
        start = lpt(np.abs(loads.mean(axis=2)), expert, gpus * slots, bins)
        slow, fast = _both(monkeypatch, pair_refine, loads, expert, gpus * slots, bins, start)
        np.testing.assert_array_equal(slow, fast, err_msg=f"seed {seed}")


def test_inputs_the_compiled_loops_cannot_take_are_refused_on_both_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = _case(2)
    bins = c["bins"]
    assert isinstance(bins, Bins)
    start = lpt(c["weight"], c["expert"], c["experts"], bins)
    loads = np.array(c["loads"]).copy()
    loads[0, 0, 0] = np.nan
    for enabled in (False, True):
        monkeypatch.setattr(compiled, "ENABLED", enabled)
        with pytest.raises(ValueError, match="swaps"):  # one budget per row
            pair_refine(c["loads"], c["expert"], c["experts"], bins, start, swaps=np.array([3]))
        with pytest.raises(ValueError, match="finite"):
            pair_refine(loads, c["expert"], c["experts"], bins, start)
        with pytest.raises(ValueError, match="finite"):
            lpt(np.full_like(c["weight"], np.inf), c["expert"], c["experts"], bins)
    with pytest.raises(ValueError, match="domain"):
        Bins(1, 4, np.arange(4))
