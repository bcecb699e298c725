"""Properties every plan must have, and the planner's behaviour on small known cases."""

from functools import partial

import numpy as np
import pytest

from moe_placement import Plan, balancedness, gpu_loads, plan
from moe_placement.layout import expert_counts
from moe_placement.metrics import gpu_moves

TOY = np.array([[600.0, 560, 120, 120, 20, 10, 10, 10]])

# (experts, redundant, gpus, nodes, groups)
SHAPES = [
    (8, 8, 8, 1, 1),
    (16, 0, 4, 1, 1),
    (16, 8, 8, 2, 4),  # hierarchical
    (24, 8, 8, 2, 3),  # groups do not divide over nodes: global
    (32, 32, 64, 8, 4),  # one slot per GPU
    (64, 8, 8, 1, 1),
    (8, 24, 8, 2, 1),  # more copies than nodes: static cannot keep them on distinct nodes
    (4, 12, 16, 4, 1),  # one slot per GPU, four copies per expert
]


def check_valid(result: Plan, layers: int, experts: int, redundant: int, gpus: int) -> None:
    phy2log = result.physical_to_logical_map
    assert phy2log.shape == (layers, experts + redundant)
    assert phy2log.dtype == np.int64
    assert phy2log.min() >= 0 and phy2log.max() < experts
    assert (expert_counts(phy2log, experts) >= 1).all(), "a logical expert lost its last slot"
    # S slots per GPU is the layout itself: P divides into G blocks of S
    assert phy2log.shape[1] % gpus == 0
    assert result.predicted_balancedness.shape == (layers,)
    assert ((result.predicted_balancedness > 0) & (result.predicted_balancedness <= 1 + 1e-9)).all()
    assert result.changed_layers.shape == (layers,) and result.changed_layers.dtype == bool


@pytest.mark.parametrize(("experts", "redundant", "gpus", "nodes", "groups"), SHAPES)
@pytest.mark.parametrize("dispatch", ["static", "dynamic"])
def test_plans_are_valid_for_random_histories(
    experts: int, redundant: int, gpus: int, nodes: int, groups: int, dispatch: str
) -> None:
    rng = np.random.default_rng(experts * 100 + gpus)
    for trial in range(3):
        skew = rng.gamma(0.3 + trial, 1.0, size=(1, 3, experts))
        loads = rng.poisson(200 * skew, size=(16, 3, experts)).astype(float)
        kw = partial(plan, num_gpus=gpus, num_nodes=nodes, num_redundant=redundant, num_groups=groups)
        result = kw(loads, dispatch=dispatch)
        check_valid(result, 3, experts, redundant, gpus)
        assert result.moved_slots == 0
        again = kw(loads, dispatch=dispatch)
        np.testing.assert_array_equal(result.physical_to_logical_map, again.physical_to_logical_map)
        moved = kw(loads, dispatch=dispatch, current=result.physical_to_logical_map, max_moves=5)
        check_valid(moved, 3, experts, redundant, gpus)
        assert moved.moved_slots <= 5


def test_zero_and_single_step_loads() -> None:
    check_valid(plan(np.zeros((4, 2, 8)), num_gpus=4, num_redundant=4), 2, 8, 4, 4)
    check_valid(plan(TOY, num_gpus=8, num_redundant=8), 1, 8, 8, 8)


def test_toy_case_beats_greedy_and_reaches_the_optimum() -> None:
    result = plan(TOY, num_gpus=8, num_redundant=8, dispatch="dynamic")
    peak = gpu_loads(result.physical_to_logical_map, TOY, 8).max()
    assert peak <= 200.0  # DeepSeek's greedy: 232; optimum with an even split: 196.7
    assert peak == pytest.approx(590 / 3)


def test_hierarchical_keeps_every_copy_on_its_groups_node() -> None:
    rng = np.random.default_rng(3)
    loads = rng.poisson(rng.gamma(0.5, 50.0, size=(1, 2, 32)), size=(32, 2, 32)).astype(float)
    result = plan(loads, num_gpus=8, num_nodes=2, num_redundant=8, num_groups=4)
    node = np.arange(40) // 20
    group = result.physical_to_logical_map // 8
    for layer in range(2):
        for g in range(4):
            assert len(set(node[group[layer] == g])) == 1


def test_static_dispatch_across_nodes_keeps_copies_on_distinct_nodes() -> None:
    rng = np.random.default_rng(4)
    loads = rng.poisson(rng.gamma(0.4, 80.0, size=(1, 2, 24)), size=(32, 2, 24)).astype(float)
    result = plan(loads, num_gpus=8, num_nodes=4, num_redundant=8, num_groups=3, dispatch="static")
    node = np.arange(32) // 8
    for layer in range(2):
        row = result.physical_to_logical_map[layer]
        for e in range(24):
            nodes = node[row == e]
            assert len(nodes) == len(set(nodes))
    # then SGLang's static rule splits every expert evenly, so static and dynamic agree
    mean = loads.mean(0)
    np.testing.assert_allclose(
        balancedness(result.physical_to_logical_map, mean, 8, "static", num_nodes=4),
        balancedness(result.physical_to_logical_map, mean, 8, "dynamic", num_nodes=4),
    )


def test_unchanged_traffic_leaves_the_placement_alone() -> None:
    rng = np.random.default_rng(5)
    loads = rng.poisson(rng.gamma(0.5, 50.0, size=(1, 4, 32)), size=(64, 4, 32)).astype(float)
    kw = partial(plan, num_gpus=8, num_redundant=8, dispatch="dynamic")
    first = kw(loads)
    again = kw(loads, current=first.physical_to_logical_map, min_layer_gain=0.02)
    assert again.moved_slots == 0
    assert not again.changed_layers.any()
    np.testing.assert_array_equal(again.physical_to_logical_map, first.physical_to_logical_map)


def test_moves_from_a_bad_placement_pay_off_and_respect_the_cap() -> None:
    rng = np.random.default_rng(6)
    loads = rng.poisson(rng.gamma(0.4, 80.0, size=(1, 4, 32)), size=(64, 4, 32)).astype(float)
    trivial = np.tile(np.concatenate([np.arange(32), np.arange(8)]), (4, 1))  # SGLang's "trivial" start
    kw = partial(plan, num_gpus=8, num_redundant=8, dispatch="dynamic")
    before = balancedness(trivial, loads.mean(0), 8)
    for cap in (0, 4, 20, None):
        result = kw(loads, current=trivial, max_moves=cap)
        assert result.moved_slots == gpu_moves(trivial, result.physical_to_logical_map, 8)
        # an expert that stays on its GPU keeps its slot, so moved copies are changed slots
        assert result.moved_slots == int((result.physical_to_logical_map != trivial).sum())
        assert cap is None or result.moved_slots <= cap
        np.testing.assert_array_equal(
            result.changed_layers, (result.physical_to_logical_map != trivial).any(1)
        )
        after = balancedness(result.physical_to_logical_map, loads.mean(0), 8)
        assert after.mean() >= before.mean() - 1e-9
        if cap == 0:
            assert result.moved_slots == 0
        if cap is None:
            assert after.mean() > before.mean() + 0.05


def test_rescore_scores_a_map_planned_elsewhere_as_plan_scores_its_own() -> None:
    """Runtime planning: the operator re-scores a runtime's map on the forecast its own inputs give;
    for the map plan() makes from the same inputs the numbers are plan()'s own."""
    from moe_placement.maps import trivial_map
    from moe_placement.planner import rescore

    rng = np.random.default_rng(12)
    history = rng.poisson(rng.gamma(0.5, 300, (6, 3, 16))).astype(float)
    steps = rng.poisson(history[-1] / 20, (4, 3, 16)).astype(float)
    prior = history * 3
    current = trivial_map(3, 16, 20)
    kw: dict[str, object] = {
        "num_gpus": 4,
        "num_redundant": 4,
        "current": current,
        "steps": steps,
        "prior": prior,
    }
    mine = plan(history, **kw)  # type: ignore[arg-type]
    theirs, kept = rescore(history, mine.physical_to_logical_map, current, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(theirs.predicted_balancedness, mine.predicted_balancedness)
    assert theirs.moved_slots == mine.moved_slots > 0 and kept.moved_slots == 0
    assert theirs.predicted_balancedness.mean() > kept.predicted_balancedness.mean()
    with pytest.raises(ValueError):
        rescore(history, current[:, :-1], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("dispatch", ["static", "dynamic"])
def test_a_refit_keeps_copy_counts_never_raises_the_peak_and_keeps_static_copies_apart(dispatch: str) -> None:
    """Under a move cap the hedging layers go on from their half-fitted plan (planner.choose_fresh):
    the search may only lower the expected peak on all scenarios, moves no copy count, and with
    static dispatch keeps an expert's copies on distinct nodes."""
    from moe_placement.fresh import place_rows, refit_rows
    from moe_placement.layout import make_layout
    from moe_placement.search import expected_peak, gpu_scenario_loads
    from moe_placement.solve import item_loads

    rng = np.random.default_rng(8)
    layout = make_layout(3, 24, num_gpus=8, num_nodes=4, num_redundant=8, num_groups=3)
    scen = rng.poisson(rng.gamma(0.4, 80.0, size=(3, 1, 24)), size=(3, 12, 24)).astype(float)  # [B, K, E]
    half = place_rows(scen[:, :6].mean(axis=1), scen[:, :6], layout, dispatch)
    out = refit_rows(half, scen, layout, dispatch)

    def peak(phy2log: np.ndarray) -> np.ndarray:
        loads = item_loads(scen, expert_counts(phy2log, 24), phy2log)
        return expected_peak(gpu_scenario_loads(loads, np.arange(32).reshape(1, 8, 4).repeat(3, axis=0)))

    np.testing.assert_array_equal(expert_counts(out, 24), expert_counts(half, 24))
    assert (peak(out) <= peak(half) * (1 + 1e-6)).all() and (peak(out) < peak(half)).any()
    if dispatch == "static":
        node = np.arange(32) // 8
        for row in out:
            for e in range(24):
                assert len(set(node[row == e])) == (row == e).sum()
    assert refit_rows(half[:0], scen[:0], layout, dispatch).shape == (0, 32)
    hierarchical = make_layout(3, 24, num_gpus=8, num_nodes=2, num_redundant=8, num_groups=4)
    with pytest.raises(ValueError, match="hierarchical"):
        refit_rows(half[:, :32], scen, hierarchical, dispatch)


def test_only_a_cap_that_binds_refits_instead_of_placing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap of a whole fresh plan per layer or more lets every layer take the fresh plan, which is
    then placed on all scenarios as without a current map (a refit one is a little worse alone)."""
    import moe_placement.planner as planner

    calls: list[int] = []
    real = planner.refit_rows
    monkeypatch.setattr(
        planner, "refit_rows", lambda phy2log, *a: calls.append(len(phy2log)) or real(phy2log, *a)
    )
    rng = np.random.default_rng(0)
    base, other = rng.gamma(0.4, 80.0, size=(2, 1, 4, 32))
    loads = rng.poisson(base, size=(64, 4, 32)).astype(float)
    # steps from two mixes of traffic: a plan hedged on them beats one packed on their mean
    steps = np.concatenate([rng.poisson(base, size=(16, 4, 32)), rng.poisson(other, size=(16, 4, 32))])
    steps = steps[rng.permutation(32)].astype(float)
    trivial = np.tile(np.concatenate([np.arange(32), np.arange(8)]), (4, 1))
    kw = partial(plan, loads, steps=steps, num_gpus=8, num_redundant=8, dispatch="dynamic", current=trivial)
    kw(max_moves=4 * 40)  # every slot of every layer: does not bind
    assert calls == []
    kw(max_moves=20)
    assert calls and calls[0] > 0  # the hedging layers went on from their trial plans
