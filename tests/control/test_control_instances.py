"""Per-instance placement (eplb mode operator): the pure core the control loop runs, no cluster."""

from __future__ import annotations

import numpy as np
import pytest

from moe_operator.control import score
from moe_operator.control.evaluate import NoFreshWindows, Policy, PoolShape
from moe_operator.control.instances import (
    Held,
    current_of,
    evaluate_instances,
    histories,
    instance_of,
    next_version,
    provenance,
    push_version,
    read_held,
)
from moe_operator.control.windows import Window
from moe_placement.baseline import baseline_plan
from moe_placement.maps import trivial_map

L, E, R, G = 4, 32, 8, 8  # layer 0 is dense (no traffic)
SHAPE = PoolShape(
    num_layers=L, num_experts=E, num_redundant=R, num_gpus=G, num_nodes=1, num_groups=1, dispatch="static"
)
BUCKET = 10.0
LIVE = trivial_map(L, E, E + R)


def policy(**kw: object) -> Policy:
    args: dict[str, object] = {
        "mode": "operator", "min_improvement": 0.02, "max_moves": 0, "min_interval_s": 0.0, "bucket_s": BUCKET,
    }  # fmt: skip
    args.update(kw)
    return Policy(**args)  # type: ignore[arg-type]


def mix(hot: list[int]) -> np.ndarray:
    """An instance's traffic: these experts hot (router affinity), the rest light."""
    rates = np.full((L, E), 20.0)
    rates[0] = 0.0
    rates[1:, hot] = 100.0
    return rates


def stream(key: str, rates: np.ndarray, n: int, rng: np.random.Generator, t0: float = 0.0) -> list[Window]:
    """n windows of one runtime, one per bucket, Poisson counts around ``rates``."""
    return [Window(key, i + 1, t0 + (i + 0.5) * BUCKET, rng.poisson(rates).astype(float)) for i in range(n)]


def two_instances(n: int = 8, seed: int = 0) -> list[Window]:
    rng = np.random.default_rng(seed)
    return [*stream("a-0/u1", mix([0, 1, 2]), n, rng), *stream("b-0/u2", mix([20, 21, 22]), n, rng)]


def test_history_keys_group_by_leader_pod_across_restarts() -> None:
    """A restarted group keeps its leader's name, not its uid: its old windows stay its own."""
    assert instance_of("dec-0-0/uid-1") == instance_of("dec-0-0/uid-2") == "dec-0-0"
    rng = np.random.default_rng(1)
    ws = [*stream("a/old", mix([0]), 2, rng), *stream("a/new", mix([0]), 2, rng, t0=2 * BUCKET)]
    restored = Window("restored", 99, 0.5 * BUCKET, np.full((L, E), 7.0), restored=True)
    keys, pool, own = histories([*ws, restored], ["a"], BUCKET)
    assert keys == [0, 1, 2, 3] and pool.shape == (4, L, E)
    np.testing.assert_allclose(own["a"][3], ws[3].counts)
    # the restored bucket (the pool's aggregate from before an operator restart) is the pool's only
    np.testing.assert_allclose(pool[0], ws[0].counts + 7.0)
    np.testing.assert_allclose(own["a"][0], ws[0].counts)


def test_held_answers_are_checked_and_stale_ones_run_the_live_map() -> None:
    good = {"version": 5, "generated_at": 1.8e9, "physical_to_logical_map": LIVE[:, ::-1].tolist()}
    held = read_held(good, SHAPE, now=1.8e9 + 100)
    assert held.version == 5 and held.phy2log is not None
    assert read_held({"version": None, "physical_to_logical_map": None}, SHAPE, 1.8e9 + 100) == Held(
        None, None
    )
    wrong = read_held({**good, "physical_to_logical_map": [[0, 1]]}, SHAPE, 1.8e9 + 100)
    assert wrong.version is None and "unfit" in wrong.problem
    dropped = LIVE.copy()
    dropped[2, :] = 0
    assert (
        "no slot"
        in read_held({**good, "physical_to_logical_map": dropped.tolist()}, SHAPE, 1.8e9 + 100).problem
    )
    assert "version" in read_held({**good, "version": "5"}, SHAPE, 1.8e9 + 100).problem
    assert read_held(["not", "a", "dict"], SHAPE, 1.8e9 + 100) == Held(None, None)
    # the engine takes the higher version of pushed and mounted: older or nothing -> the live map
    assert current_of(held, LIVE, 5)[1] == 5 and current_of(held, LIVE, 5)[0] is held.phy2log
    assert current_of(held, LIVE, 6) == (LIVE, 6)
    assert current_of(None, LIVE, 3) == (LIVE, 3)


def test_versions_stay_above_every_runtime() -> None:
    held = {"a": Held(7, LIVE), "b": Held(None, None)}
    assert next_version(4, held) == 8  # a runtime pushed v7 outside the loop
    assert push_version(4, held["a"]) == 7 and push_version(4, held["b"]) == 4 and push_version(4, None) == 4


def test_two_instances_get_their_own_maps() -> None:
    ws = two_instances()
    currents = {"a-0": LIVE, "b-0": LIVE}
    ev = evaluate_instances(ws, currents, LIVE, SHAPE, policy(), {}, fresh_after=0.0)
    assert ev.publish and {r.name for r in ev.changed} == {"a-0", "b-0"}
    a, b = ev.results["a-0"].candidate, ev.results["b-0"].candidate
    assert not np.array_equal(a, b), "different traffic, one map"
    assert ev.pool_candidate is not None and SHAPE.problems(ev.pool_candidate) == []
    for r in ev.results.values():  # each decided on its own numbers, against its own current map
        assert r.predicted > r.measured + 0.02 and r.decision.reason == "published"
    prov = provenance(ev, 3)
    assert (
        prov["a-0"]["version"] == 3 and prov["a-0"]["changed"] and "physicalToLogicalMap" not in prov["a-0"]
    )


def test_no_instance_is_planned_worse_than_its_own_engine_eplb() -> None:
    """Scored on 200 draws of each instance's next window: against DeepSeek EPLB on its own last
    window (what its engine runs without the operator). The guard compares on the planner's
    scenarios, so one seed may lose by noise (bounded here); on average the plans are better.
    With 20 draws the score's own noise was as large as the bound (one case read -0.0056 on
    20 draws and +0.0012 on 200)."""
    gains = []
    for seed in range(3):
        ws = two_instances(seed=seed)
        ev = evaluate_instances(ws, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(), {}, 0.0)
        for name, hot in (("a-0", [0, 1, 2]), ("b-0", [20, 21, 22])):
            own_last = next(w for w in reversed(ws) if instance_of(w.instance) == name).counts
            engine = baseline_plan(own_last, num_gpus=G, num_redundant=R)
            nxt = np.random.default_rng(100 + seed).poisson(mix(hot), size=(200, L, E)).astype(float)
            mine = np.mean([score.measured(ev.results[name].target, w, G, 1, "static") for w in nxt])
            theirs = np.mean([score.measured(engine, w, G, 1, "static") for w in nxt])
            assert mine >= theirs - 0.005, (seed, name, mine, theirs)
            gains.append(mine - theirs)
    assert np.mean(gains) > 0, gains


def test_a_balanced_instance_keeps_its_map_while_another_changes() -> None:
    ws = two_instances()
    first = evaluate_instances(ws, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(), {}, 0.0)
    currents = {"a-0": first.results["a-0"].candidate, "b-0": LIVE}
    ev = evaluate_instances(ws, currents, LIVE, SHAPE, policy(), {}, 0.0)
    assert not ev.results["a-0"].decision.publish and ev.results["b-0"].decision.publish
    assert ev.results["a-0"].target is currents["a-0"]
    assert "new placement for 1 of 2" in ev.message()


def test_each_instance_has_its_own_min_interval_and_move_cap() -> None:
    ws = two_instances()
    since = {"a-0": 5.0, "b-0": 500.0}
    ev = evaluate_instances(
        ws, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(min_interval_s=60.0), since, 0.0
    )
    assert ev.results["a-0"].decision.reason == "min_interval" and ev.results["b-0"].decision.publish
    capped = evaluate_instances(ws, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(max_moves=3), {}, 0.0)
    assert all(r.moved <= 3 for r in capped.results.values())


def test_paused_or_quiet_instances_publish_nothing() -> None:
    ws = two_instances()
    paused = evaluate_instances(
        ws, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(paused="rollback"), {}, 0.0
    )
    assert not paused.publish and paused.pool_candidate is None
    assert all(r.decision.reason == "paused" for r in paused.results.values())
    # b's windows are old: only a is planned; an instance the loop does not know is not planned
    late = [w for w in ws if not (w.instance.startswith("b") and w.ended_at > 30)]
    ev = evaluate_instances(late, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(), {}, fresh_after=50.0)
    assert set(ev.results) == {"a-0"}
    with pytest.raises(NoFreshWindows):
        evaluate_instances(ws, {"c-0": LIVE}, LIVE, SHAPE, policy(), {}, 0.0)


def test_an_instance_with_only_a_window_or_two_still_plans() -> None:
    """A restarted pod (or a new group) has a bucket of its own among the pool's many."""
    rng = np.random.default_rng(3)
    ws = [*stream("a-0/u1", mix([0, 1]), 8, rng), *stream("b-0/new", mix([5, 6]), 1, rng, t0=7 * BUCKET)]
    ev = evaluate_instances(ws, {"a-0": LIVE, "b-0": LIVE}, LIVE, SHAPE, policy(), {}, 0.0)
    assert SHAPE.problems(ev.results["b-0"].candidate) == []
    assert ev.history_buckets == 8


def test_each_instance_is_planned_on_its_own_newest_step_samples() -> None:
    """The same windows with and without step samples on one instance's newest window (its passes
    swing between two hot sets): only that instance's plan changes, and provenance says how many."""
    rng = np.random.default_rng(4)
    ws = two_instances(n=6, seed=4)
    newest = max((w for w in ws if w.instance == "a-0/u1"), key=lambda w: w.ended_at)
    swing = np.zeros((8, L, E))
    for k in range(8):
        hot = [0, 1, 2] if k % 2 else [8, 9, 10]
        swing[k] = rng.poisson(mix(hot) / 8)
    sampled = Window(
        newest.instance, newest.seq, newest.ended_at, swing.sum(axis=0), steps=swing.astype(np.float32)
    )
    with_steps = [sampled if w is newest else w for w in ws]
    without = [
        Window(newest.instance, newest.seq, newest.ended_at, swing.sum(axis=0)) if w is newest else w
        for w in ws
    ]
    currents = {"a-0": LIVE, "b-0": LIVE}
    args = (currents, LIVE, SHAPE, policy(), {}, 0.0)
    a = evaluate_instances(with_steps, *args)
    b = evaluate_instances(without, *args)
    assert a.results["a-0"].step_samples == 8 and b.results["a-0"].step_samples == 0
    assert a.results["b-0"].step_samples == 0
    assert not np.array_equal(a.results["a-0"].candidate, b.results["a-0"].candidate)
    np.testing.assert_array_equal(a.results["b-0"].candidate, b.results["b-0"].candidate)
    rows = provenance(a, 3)
    assert rows["a-0"]["stepSamples"] == 8 and rows["b-0"]["stepSamples"] == 0


def test_the_window_whose_samples_history_keeps_is_the_one_the_plan_reads() -> None:
    """Two windows ending at the same time: History and newest_fresh pick the same one."""
    from moe_operator.control.instances import newest_fresh
    from moe_operator.control.windows import History

    counts = mix([0])
    h = History()
    h.add([Window("a-0/u", 1, 100.0, counts, steps=np.stack([counts / 2]).astype(np.float32))])
    h.add([Window("a-0/u", 2, 100.0, counts, steps=np.stack([counts / 4]).astype(np.float32))])
    picked = newest_fresh(list(h.windows), 0.0)["a-0"]
    assert picked.seq == 2 and picked.steps is not None
