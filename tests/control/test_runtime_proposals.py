"""Planning in the runtimes (--planning runtimes): the operator's side, pure. A runtime's map is
checked and scored by the operator on its own windows; one that is the operator's own plan gives
the same decision, one that is unsafe, over the cap or not a map is planned by the operator instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_control_instances import BUCKET, LIVE, SHAPE, mix, policy, stream

from moe_contract import plan_wire
from moe_operator.control.instances import evaluate_instances, histories, plan_requests
from moe_operator.handlers.runtime_planning import planned_here, read_proposal
from moe_placement import plan_instances
from moe_placement.instances import own_history

NOW = 8 * BUCKET


def windows(seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    return [*stream("a-0/u1", mix([0, 1, 2]), 8, rng), *stream("b-0/u2", mix([20, 21, 22]), 8, rng)]


def own_plans(ws: list[Any], **pol: object) -> dict[str, np.ndarray]:
    """What the operator would plan for each instance (what an honest runtime proposes)."""
    _, pool, own = histories(ws, ["a-0", "b-0"], BUCKET)
    plans = plan_instances(own, num_gpus=SHAPE.num_gpus, num_redundant=SHAPE.num_redundant, pool=pool,
                           currents=dict.fromkeys(own, LIVE), max_moves=policy(**pol).max_moves or None)  # fmt: skip
    return {n: p.physical_to_logical_map for n, p in plans.items()}


def evaluate(ws: list[Any], proposals: dict[str, np.ndarray] | None, **pol: object) -> Any:
    currents = {"a-0": LIVE, "b-0": LIVE}
    return evaluate_instances(
        ws, currents, LIVE, SHAPE, policy(**pol), dict.fromkeys(currents), 0.0, proposals
    )


def same(a: Any, b: Any) -> None:
    for n in a.results:
        ra, rb = a.results[n], b.results[n]
        np.testing.assert_array_equal(ra.candidate, rb.candidate)
        assert (ra.predicted, ra.moved, ra.decision) == (rb.predicted, rb.moved, rb.decision)
    np.testing.assert_array_equal(a.pool_candidate, b.pool_candidate)


def test_an_honest_proposal_gives_the_operators_own_decision() -> None:
    ws = windows()
    same(evaluate(ws, own_plans(ws)), evaluate(ws, None))


@pytest.mark.parametrize(
    "bad",
    [
        lambda m: m[:, :-1],  # another shape
        lambda m: np.zeros_like(m),  # every slot one expert: the others lost
        lambda m: np.full_like(m, 10**6),  # no such expert
        lambda m: -m,
        lambda m: np.array([["x"]]),
    ],
)
def test_a_proposal_that_is_not_a_safe_map_is_planned_here(bad: Any) -> None:
    ws = windows()
    honest = evaluate(ws, None)
    proposals = own_plans(ws)
    proposals["a-0"] = bad(proposals["a-0"])
    same(evaluate(ws, proposals), honest)


def test_a_proposal_past_the_move_cap_is_planned_here() -> None:
    ws = windows()
    uncapped = own_plans(ws)  # moves freely from the trivial map
    capped = evaluate(ws, None, max_moves=4)
    assert max(r.moved for r in capped.results.values()) <= 4
    same(evaluate(ws, uncapped, max_moves=4), capped)


def test_a_proposal_the_operator_scores_below_the_current_map_is_planned_here() -> None:
    """A runtime cannot claim a gain: the operator scores the map and the one the instance runs on
    the same forecast. (Against the newest window alone, a burst on the current map would let a
    worse map through: the hostile probe's case.)"""
    ws = windows()
    currents = own_plans(ws)  # the instances already run their good plans
    bad = currents["a-0"].copy()
    bad[1:, : 2 * (E := SHAPE.num_experts // SHAPE.num_gpus)] = 0  # the hot expert 0 on one GPU, many times
    bad[1:, 2 * E :] = np.resize(np.arange(1, SHAPE.num_experts), bad[1:, 2 * E :].shape)
    assert not SHAPE.problems(bad)
    args = (ws, currents, LIVE, SHAPE, policy(min_improvement=0.0), dict.fromkeys(currents), 0.0)
    ours = evaluate_instances(*args)
    theirs = evaluate_instances(*args, {"a-0": bad, "b-0": currents["b-0"]})
    same(theirs, ours)  # planned here, as if the runtime had not answered
    assert not np.array_equal(theirs.results["a-0"].candidate, bad)


def test_requests_carry_the_pool_buckets_and_the_runtime_sums_its_own_on_them() -> None:
    """The runtime's own history (its windows on the request's keys) is the operator's: same plans."""
    ws = windows()
    requests = plan_requests(ws, {"a-0": LIVE, "b-0": LIVE, "gone-0": LIVE}, SHAPE, policy(), 0.0, "v3-1")
    assert sorted(requests) == ["a-0", "b-0"]  # instances with windows only
    keys, pool, own = histories(ws, ["a-0", "b-0"], BUCKET)
    for name, r in requests.items():
        wire = plan_wire.decode(plan_wire.encode(r))
        assert wire.keys == tuple(keys) and wire.request == "v3-1" and wire.max_moves is None
        np.testing.assert_array_equal(wire.prior, pool)
        np.testing.assert_array_equal(wire.current, LIVE)
        mine = [(w.ended_at, w.counts) for w in ws if w.instance.startswith(name)]
        np.testing.assert_array_equal(own_history(mine, wire.keys, wire.bucket_s, pool.shape[1:]), own[name])


def test_answers_are_read_as_untrusted() -> None:
    m = [[0, 1], [1, 0]]
    assert read_proposal({"request": "r", "state": "done", "physical_to_logical_map": m}, "r")[0] == "done"
    assert (
        read_proposal({"request": "old", "state": "done", "physical_to_logical_map": m}, "r")[0] == "waiting"
    )
    assert read_proposal({"request": "r", "state": "planning"}, "r")[0] == "waiting"
    assert read_proposal({"request": "r", "state": "failed", "message": "x" * 10_000}, "r") == (
        "failed",
        "x" * 120,
    )
    for garbage in ([[1, "a"]], [[1], [1, 2]], "map", [[10**30]], None, [[1.7, 2.2]], [[True, 1]], [1, 2],
                    [[[1]]]):  # fmt: skip
        got = read_proposal({"request": "r", "state": "done", "physical_to_logical_map": garbage}, "r")
        assert got == ("refused", "the proposed map is not a matrix of integers"), garbage
    assert read_proposal("HTTP 404", "r") == ("refused", "HTTP 404")
    assert planned_here({}) == ""
    assert "2 instance(s)" in planned_here({"b": "HTTP 404", "a": "no plan after 60s"})
