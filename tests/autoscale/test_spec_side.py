"""The API side: what admission refuses, the policy it yields, and the size the reconciler renders."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.autoscale import codec
from moe_operator.autoscale.decide import PoolDecision, PoolObservation, PoolState, decide_pool
from moe_operator.autoscale.effective import applied_widths, effective_spec, pool_scales, with_widths
from moe_operator.autoscale.model import Fit
from moe_operator.autoscale.observe import idle, pool_observation
from moe_operator.autoscale.policy import pool_policy, scaled_pools
from moe_operator.autoscale.scale import Scale, Step, width_to_apply
from moe_operator.autoscale.signals import Histogram, InstanceSample
from moe_operator.handlers.autoscale_loop import at_width, surge_room, width_view
from moe_operator.handlers.reconcile import width_gate
from moe_operator.handlers.widths import running_spec
from moe_operator.reconcile.groups import WidthGate
from moe_operator.render.group import Owner
from moe_operator.render.network import operator_ports
from moe_operator.render.shared import router_objects
from moe_operator.validation import validate
from moe_operator.validation.platform import DEFAULT_POLICY

EXAMPLES = Path(__file__).parents[2] / "examples"
NOW = 1_800_000_000.0
AUTO = {"mode": "Operator", "minReplicas": 1, "maxReplicas": 4, "slo": {"itl": "60ms", "percentile": 90}}


def _spec(name: str = "qwen3-30b-a3b-single-node.yaml", **pools: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())["spec"]
    for pool, auto in pools.items():
        spec[pool]["autoscaling"] = auto
    return spec


def _messages(spec: dict[str, Any]) -> str:
    return " | ".join(str(p) for p in validate(spec, None, None))


def test_a_plain_autoscaled_pool_is_admitted() -> None:
    assert _messages(_spec(decode=AUTO)) == ""


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (_spec(decode={**AUTO, "minReplicas": 5}), "must not exceed maxReplicas"),
        (_spec(decode={"mode": "Operator"}), "needs slo.ttft or slo.itl"),
        (_spec(decode={**AUTO, "slo": {"percentile": 90}}), "needs slo.ttft or slo.itl"),
        (_spec(decode={**AUTO, "slo": {"itl": "20s"}}), "duration from 1ms to 10s"),
        (_spec(decode={**AUTO, "bootTime": "5 minutes"}), "duration"),
        (_spec(decode={**AUTO, "targetUtilization": 30}), "greater than or equal"),
        (
            _spec("deepseek-v3-pd-h100.yaml", prefill={**AUTO, "slo": {"ttft": "1s", "itl": "50ms"}}),
            "a prefill pool generates no tokens",
        ),
        (
            _spec("deepseek-v3-pd-h100.yaml", decode={**AUTO, "slo": {"ttft": "1s", "itl": "50ms"}}),
            "move it to spec.prefill.autoscaling.slo.ttft",
        ),
        (
            {**_spec(decode={**AUTO, "minReplicas": 2}), "gpuBudget": 8},
            "spec.gpuBudget (8) is below the 16 GPUs",
        ),
    ],
)
def test_bad_autoscaling_is_refused_with_the_fix(spec: dict[str, Any], says: str) -> None:
    assert says in _messages(spec)


def test_external_mode_is_not_scaled_and_needs_no_slo() -> None:
    spec = MoEDeploymentSpec.model_validate(_spec(decode={"mode": "External"}))
    assert _messages(_spec(decode={"mode": "External"})) == ""
    assert scaled_pools(spec) == {}
    assert effective_spec(spec, {}, NOW) == (spec, {})
    assert operator_ports(spec) == [9400]


def test_policy_numbers_come_from_the_spec() -> None:
    auto = {
        **AUTO,
        "bootTime": "5m",
        "scaleInCooldown": "3m",
        "targetUtilization": 80,
        "burstMemory": "2h",
        "burstReserve": 120,
    }
    spec = MoEDeploymentSpec.model_validate(_spec(decode=auto))
    p = pool_policy(spec, "decode")
    assert (p.min_instances, p.max_instances, p.boot_s, p.scale_in_cooldown_s) == (1, 4, 300, 180)
    assert p.headroom == 0.8 and p.surge_half_life_s == 7200 and p.width.gpus == 8
    assert p.burst_reserve == 1.2
    assert [(o.metric, o.slo_s, o.quantile) for o in p.objectives] == [("itl", 0.06, 0.9)]
    assert operator_ports(spec) == [9400, spec.engine.port]


def test_the_reconciler_renders_status_sizes_and_the_router_lists_only_serving() -> None:
    spec = MoEDeploymentSpec.model_validate(_spec(decode={**AUTO, "maxReplicas": 6}))
    status = {"autoscaling": {"decode": {"instances": 3, "serving": 2, "reason": "draining"}}}
    effective, serving = effective_spec(spec, status, NOW)
    assert effective.decode.replicas == 3 and serving == {"decode": 2}
    router = next(
        o for o in router_objects(effective, Owner("q", "ns", "uid"), serving) if o["kind"] == "Deployment"
    )
    args = " ".join(router["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "-decode-1." in args and "-decode-2." not in args
    # status lost or tampered: the spec's size inside the bounds, never zero
    for broken in ({}, {"autoscaling": "x"}, {"autoscaling": {"decode": {"instances": -1, "serving": 0}}}):
        again, listed = effective_spec(spec, broken, NOW)
        assert again.decode.replicas == 1 and listed == {"decode": 1}
    # tampered: far above maxReplicas, fractional counts: the spec's bounds hold
    huge, listed = effective_spec(spec, {"autoscaling": {"decode": {"instances": 200, "serving": 200}}}, NOW)
    assert huge.decode.replicas == 6 and listed == {"decode": 6}
    frac, listed = effective_spec(spec, {"autoscaling": {"decode": {"instances": 1.5, "serving": 0}}}, NOW)
    assert frac.decode.replicas == 1 and listed == {"decode": 1}


def test_a_width_roll_leaves_its_instance_off_the_router_and_out_of_the_pool_observation() -> None:
    spec = MoEDeploymentSpec.model_validate(_spec(decode={**AUTO, "maxReplicas": 6}))
    since = "2027-01-15T08:00:00Z"
    status = {"autoscaling": {"decode": {"instances": 3, "serving": 3, "rollingInstance": 1,
                                         "rollingReleased": True, "rollingSince": since}}}  # fmt: skip
    (scale,) = pool_scales(spec, status, NOW).values()
    assert (scale.serving, scale.rolling, scale.released) == (3, 1, True)
    effective, serving = effective_spec(spec, status, NOW)
    objects = router_objects(effective, Owner("q", "ns", "uid"), serving, {"decode": 1})
    router = next(o for o in objects if o["kind"] == "Deployment")
    args = " ".join(router["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "-decode-0." in args and "-decode-1." not in args and "-decode-2." in args
    assert router["metadata"]["annotations"][K.ROUTER_WORKERS] == "decode=3-1"
    # one instance listed: the router keeps it (an empty list would serve nothing either)
    alone = router_objects(effective, Owner("q", "ns", "uid"), {"decode": 1}, {"decode": 0})
    alone_args = " ".join(next(o for o in alone if o["kind"] == "Deployment")["spec"]["template"]["spec"]
                          ["containers"][0]["command"])  # fmt: skip
    assert "-decode-0." in alone_args
    samples = {0: _sample(2.0), 1: _sample(0.0, running=0), 2: _sample(2.0)}
    obs = pool_observation(10.0, samples, 3, pool_policy(spec, "decode").objectives, off=1)
    assert obs is not None and obs.serving == 2 and obs.rate == 4.0


def _sample(rate: float, running: float = 1, itl: tuple[float, ...] = (0.0, 30.0, 30.0)) -> InstanceSample:
    itl_h = Histogram((0.04, 0.08, float("inf")), itl)
    return InstanceSample(
        rate=rate, running=running, queued=0.0, handoff=0.0, token_usage=0.5, ttft=None, itl=itl_h
    )


def test_the_pool_observation_counts_only_serving_instances() -> None:
    samples = {0: _sample(2.0), 1: _sample(3.0), 2: _sample(9.0, running=0)}
    spec = MoEDeploymentSpec.model_validate(_spec(decode=AUTO))
    obs = pool_observation(10.0, samples, 2, pool_policy(spec, "decode").objectives)
    assert isinstance(obs, PoolObservation)
    assert (obs.serving, obs.rate) == (2, 5.0)
    assert obs.latency["itl"] == pytest.approx(0.04 + 0.04 * ((0.9 * 60 - 0) / 60))
    assert idle(samples) == frozenset({2})
    few = {0: _sample(2.0, itl=(0.0, 5.0, 5.0))}
    obs = pool_observation(10.0, few, 1, pool_policy(spec, "decode").objectives)
    assert obs is not None and obs.latency["itl"] is None  # 5 requests say nothing about p90
    assert pool_observation(10.0, {}, 1, ()) is None


def test_an_interval_with_instances_of_two_widths_counts_but_does_not_teach() -> None:
    """During a width change's roll, instance 1 still runs at the old width: its requests count
    toward the pool's rate, but the interval is not one of the new width's."""
    samples = {0: _sample(2.0), 1: _sample(3.0), 2: _sample(9.0)}
    objectives = pool_policy(MoEDeploymentSpec.model_validate(_spec(decode=AUTO)), "decode").objectives
    mixed = pool_observation(10.0, samples, 2, objectives, at_width={0, 2})
    assert mixed is not None and (mixed.rate, mixed.one_width) == (5.0, False)
    listed_agree = pool_observation(10.0, samples, 2, objectives, at_width={0, 1})
    assert listed_agree is not None and listed_agree.one_width  # instance 2 is off the list
    assert pool_observation(10.0, samples, 2, objectives) == listed_agree
    # a P/D prefill pool's TTFT comes from the decode instances: one of those at the old width counts too
    decode = {0: _sample(1.0), 1: _sample(1.0)}
    prefill = pool_observation(10.0, samples, 2, objectives, decode, at_width={0, 1}, ttft_at_width={0})
    assert prefill is not None and not prefill.one_width


def test_instances_at_width_count_ranks_not_being_deleted() -> None:
    spec = MoEDeploymentSpec.model_validate(_spec(decode=AUTO))
    width = spec.decode.nodes_per_replica  # type: ignore[union-attr]

    def pod(instance: int, deleting: bool = False) -> dict[str, object]:
        return {"pool": "decode", "instance": instance, "ready": True, "deleting": deleting}

    pods = [pod(0) for _ in range(width)] + [pod(1) for _ in range(width + 1)]
    pods += [pod(2) for _ in range(width)] + [pod(2, deleting=True)]
    assert at_width(spec, pods, "decode") == frozenset({0, 2})  # type: ignore[arg-type]


def test_spec_replicas_stay_the_scale_subresource_for_external(tmp_path: Path) -> None:
    spec = copy.deepcopy(_spec(decode={"mode": "External"}))
    spec["decode"]["replicas"] = 3
    parsed = MoEDeploymentSpec.model_validate(spec)
    assert (
        effective_spec(parsed, {"autoscaling": {"decode": {"instances": 1, "serving": 1}}}, NOW)[
            0
        ].decode.replicas
        == 3
    )


def test_width_options_carry_the_kv_room_the_capacity_model_gives() -> None:
    """DeepSeek-V3 decode on H100: a wider instance holds fewer expert weights per GPU, so more KV."""
    raw = _spec(
        "deepseek-v3-pd-h100.yaml", decode={**AUTO, "slo": {"itl": "50ms"}, "nodesPerReplicaOptions": [18, 5]}
    )
    raw["prefill"]["autoscaling"] = {**AUTO, "slo": {"ttft": "2s"}}
    assert _messages(raw) == ""
    spec = MoEDeploymentSpec.model_validate(raw)
    p = pool_policy(spec, "decode")
    by_nodes = {w.nodes: w for w in p.widths}
    assert p.width.nodes == 9 and 9 in by_nodes and 18 in by_nodes
    assert 5 not in by_nodes  # 5 x 8 = 40 GPUs does not divide 256 + 32 expert slots
    assert by_nodes[18].kv_tokens / by_nodes[18].gpus > by_nodes[9].kv_tokens / by_nodes[9].gpus
    # KV full at modest compute: the wider width is recommended, in status and by message
    state = PoolState(instances=2, fits={"itl": Fit(0.02, 40.0)})
    obs = PoolObservation(0.0, 2, 2.0, {"itl": 0.025}, 0.99, 50.0)
    d = decide_pool(p, state, obs)
    assert d.width is not None and d.width.nodes == 18 and "18 node(s)" in d.message
    assert codec.write_pool(Scale(2, 2), Step(Scale(2, 2), ""), d, obs)["recommendedNodesPerReplica"] == 18
    assert pool_policy(MoEDeploymentSpec.model_validate(_spec(decode=AUTO)), "decode").widths == ()


def test_a_width_change_reads_each_instance_width_from_its_group_not_from_its_pods() -> None:
    """An instance missing a rank pod is neither up nor taken for a width change: the width its
    group runs is the one recorded on its object (held back until its turn)."""
    spec = MoEDeploymentSpec.model_validate(
        _spec("deepseek-v3-pd-h100.yaml", decode={**AUTO, "slo": {"itl": "50ms"}})
    )

    def pods(instance: int, n: int, ready: bool = True) -> list[dict[str, object]]:
        return [{"pool": "decode", "instance": instance, "ready": ready, "deleting": False} for _ in range(n)]

    running = pods(0, 4) + pods(1, 3) + pods(2, 9) + pods(3, 8) + pods(3, 1, ready=False)
    widths = {("decode", 0): 4, ("decode", 1): 4, ("decode", 2): 9}
    old, up = width_view(spec, running, "decode", widths)  # type: ignore[arg-type]
    assert (old, up) == ({0, 1}, {0, 2})
    # no width change: a rank missing is not one (the instance is simply not up)
    assert width_view(spec, pods(0, 8), "decode", {("decode", 0): 9}) == (set(), set())  # type: ignore[arg-type]


def test_the_extra_instance_of_a_width_change_stays_inside_the_gpu_budget() -> None:
    """Both pools in one tick, growth this tick, and a narrowing counted at the width that runs."""
    raw = _spec(
        "deepseek-v3-pd-h100.yaml",
        prefill={**AUTO, "slo": {"ttft": "1s"}},
        decode={**AUTO, "slo": {"itl": "50ms"}},
    )
    spec = MoEDeploymentSpec.model_validate({**raw, "gpuBudget": 250})  # 32 + 2 x 72 = 176 held
    policies = {p: pool_policy(spec, p) for p in ("prefill", "decode")}
    scales = {"prefill": Scale(1, 1), "decode": Scale(2, 2)}

    def steady(n: int) -> PoolDecision:
        return PoolDecision(n, n, "steady", "m", n, PoolState(instances=n, fits={}))

    decisions = {"prefill": steady(1), "decode": steady(2)}
    room = partial(surge_room, spec, policies, scales)  # type: ignore[arg-type]
    assert room(decisions, {}, "prefill", 0) and room(decisions, {}, "decode", 0)  # each alone fits
    assert not room(decisions, {}, "decode", 32)  # not after the prefill pool's extra instance
    assert not room({**decisions, "prefill": steady(3)}, {}, "decode", 0)  # nor beside its growth
    # decode 9 -> 4 nodes: the instances still run 72 GPUs each, not 32
    narrower = MoEDeploymentSpec.model_validate(
        {**raw, "gpuBudget": 200, "decode": {**raw["decode"], "nodesPerReplica": 4}}
    )
    nps = {p: pool_policy(narrower, p) for p in ("prefill", "decode")}
    held_at_nine = {("decode", 0): 9, ("decode", 1): 9}
    assert not surge_room(narrower, nps, scales, decisions, held_at_nine, "decode", 0)  # type: ignore[arg-type]
    assert surge_room(narrower, nps, scales, decisions, {}, "decode", 0)  # type: ignore[arg-type]
    full = {"prefill": Scale(1, 1), "decode": Scale(4, 4)}
    assert not surge_room(
        spec.model_copy(update={"gpu_budget": None}), policies, full, decisions, {}, "decode", 0
    )  # type: ignore[arg-type]


def test_width_gate_holds_the_listed_and_the_draining_and_lets_the_released_roll() -> None:
    assert width_gate(Scale(3, 2, draining=True)) == WidthGate(3, None)
    assert width_gate(Scale(3, 3, rolling=1, rolling_since=NOW)) == WidthGate(3, None)
    assert width_gate(Scale(3, 3, rolling=1, released=True, rolling_since=NOW)) == WidthGate(3, 1)


def test_the_width_the_autoscaler_applies_is_run_only_while_it_is_the_operators_choice() -> None:
    """widthChanges Apply: status.autoscaling.<pool>.nodesPerReplica runs while the spec's width is
    still nodesPerReplicaFrom, the width is one of nodesPerReplicaOptions, and admission takes the
    spec at it; anything else runs the spec as written."""
    raw = _spec("deepseek-v3-pd-h100.yaml", decode={**AUTO, "slo": {"itl": "50ms"}, "widthChanges": "Apply",
                                                    "nodesPerReplicaOptions": [18]})  # fmt: skip
    raw["decode"]["nodesPerReplica"] = 9
    spec = MoEDeploymentSpec.model_validate(raw)

    def status(**fields: object) -> dict[str, Any]:
        return {"autoscaling": {"decode": {"instances": 2, "serving": 2, **fields}}}

    chosen = status(nodesPerReplica=18, nodesPerReplicaFrom=9)
    assert applied_widths(spec, chosen) == {"decode": 18}
    assert applied_widths(spec, status(nodesPerReplica=18, nodesPerReplicaFrom=4)) == {}  # the spec moved on
    assert applied_widths(spec, status(nodesPerReplica=12, nodesPerReplicaFrom=9)) == {}  # not an option
    assert applied_widths(spec, status(nodesPerReplica=18.0, nodesPerReplicaFrom=9)) == {}
    assert applied_widths(spec, status(nodesPerReplica=True, nodesPerReplicaFrom=9)) == {}
    assert applied_widths(spec, {"autoscaling": "x"}) == {}
    recommend = MoEDeploymentSpec.model_validate({**raw, "decode": {**raw["decode"], "autoscaling": {
        **raw["decode"]["autoscaling"], "widthChanges": "Recommend"}}})  # fmt: skip
    assert applied_widths(recommend, chosen) == {}
    # run only where admission takes the spec at that width
    ran = running_spec(spec, raw, chosen, DEFAULT_POLICY, "ns")
    assert (
        ran.decode is not None and ran.decode.nodes_per_replica == 18 and spec.decode.nodes_per_replica == 9
    )  # type: ignore[union-attr]
    assert with_widths(raw, {"decode": 18}, lambda r: ["refused"]) is None
    assert running_spec(spec, raw, status(), DEFAULT_POLICY, "ns") is spec


def test_a_width_is_applied_only_wider_between_changes_with_one_instance_left_serving() -> None:
    steady = Scale(2, 2)
    assert width_to_apply(True, 4, 2, steady, (), True) == (4, "")
    # nothing to apply, nothing to say
    assert width_to_apply(False, 4, 2, steady, (), True) == (None, "")  # Recommend
    assert width_to_apply(True, None, 2, steady, (), True) == (None, "")
    assert width_to_apply(True, 2, 2, steady, (), True) == (None, "")
    assert width_to_apply(True, 1, 2, steady, (), True) == (None, "")  # narrower: only recommended
    # held, and status says why (widthHeld)
    held = {
        "budget": width_to_apply(True, 4, 2, steady, (), False),  # the pool at 4 past the GPU budget
        "alone": width_to_apply(True, 4, 2, Scale(1, 1), (), True),  # its only instance would go
        "rolls": width_to_apply(True, 4, 2, steady, (1,), True),  # a width change still rolls
        "boots": width_to_apply(True, 4, 2, Scale(3, 2), (), True),  # a scale-out boots
        "drains": width_to_apply(True, 4, 2, Scale(3, 2, draining=True), (), True),
        "rolling": width_to_apply(True, 4, 2, Scale(2, 2, rolling=0, rolling_since=NOW), (), True),
    }
    assert all(width is None for width, _ in held.values())
    assert "spec.gpuBudget" in held["budget"][1] and "minReplicas 2" in held["alone"][1]
    assert held["rolls"][1] == held["rolling"][1] == "a width change is still rolling"
    spec_roll = Scale(2, 2, rolling=0, rolling_since=NOW, rolling_spec=True)
    assert width_to_apply(True, 4, 2, spec_roll, (), True) == (None, "a spec change is still rolling")
    assert held["boots"][1] == held["drains"][1] == "a scale-out or drain is under way"
    # a chosen width that did not come up: none is chosen again before widthRetryAfter
    paused = width_to_apply(True, 4, 2, steady, (), True, retry_at=NOW + 90, now=NOW)
    assert paused[0] is None and "did not come up" in paused[1] and codec.write_time(NOW + 90) in paused[1]
    assert width_to_apply(True, 4, 2, steady, (), True, retry_at=NOW, now=NOW) == (4, "")


def _chosen_18_of_9(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """widthChanges Apply has chosen 18 nodes for a decode pool whose spec says 9, three instances;
    the events choose_width posts; a decision recommending 18; the step of a released one stuck."""
    from moe_operator.autoscale.decide import Width
    from moe_operator.handlers import autoscale_loop

    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        autoscale_loop.kopf,
        "event",
        lambda body, type, reason, message: events.append((type, reason, message)),
    )
    raw = _spec("deepseek-v3-pd-h100.yaml", decode={**AUTO, "slo": {"itl": "50ms"}, "widthChanges": "Apply",
                                                    "nodesPerReplicaOptions": [18], "bootTime": "5m"})  # fmt: skip
    raw["decode"]["nodesPerReplica"] = 9
    written = MoEDeploymentSpec.model_validate(raw)
    chosen = {"instances": 3, "serving": 3, "nodesPerReplica": 18, "nodesPerReplicaFrom": 9}
    spec = running_spec(written, raw, {"autoscaling": {"decode": chosen}}, DEFAULT_POLICY, "ns")
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": "u"}, "spec": raw}
    decision = PoolDecision(3, 3, "steady", "", 3, PoolState(instances=3, fits={}), width=Width(18, 144, 1.0))
    stuck = Step(
        Scale(3, 3, rolling=0, released=True, rolling_since=NOW), "width_stuck", "WidthRollStuck", "x"
    )
    return events, raw, written, chosen, spec, body, decision, stuck


def test_a_chosen_width_that_does_not_come_up_is_given_up_and_not_chosen_again_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """widthChanges Apply chose 18 nodes; the instance released to roll onto it is stuck (or the one
    created at it was rolled back): status goes back to the spec's 9 with a Warning, widthRetryAfter
    six bootTimes ahead, and the next ticks hold the recommendation until then."""
    from moe_operator.handlers import autoscale_loop

    events, _, written, chosen, spec, body, decision, stuck = _chosen_18_of_9(monkeypatch)
    status = {"autoscaling": {"decode": chosen}}

    def choose(step: Step, st: dict[str, Any], at: dict[str, Any] | None = None) -> dict[str, Any]:
        run = spec if at is None else at
        return autoscale_loop.choose_width(
            body, written, run, st, None, "decode", decision, step, frozenset({1, 2}), 0, NOW
        )  # type: ignore[arg-type]

    given_up = choose(stuck, status)
    assert given_up["nodesPerReplica"] is None and given_up["nodesPerReplicaFrom"] is None
    assert given_up["widthRetryAfter"] == codec.write_time(NOW + 6 * 300)
    assert events[-1][:2] == ("Warning", "WidthGivenUp") and "back to 9 node(s)" in events[-1][2]
    assert "(1 chosen width(s) in a row)" in events[-1][2] and "bootTime x6" in events[-1][2]
    # an extra instance created for the change and rolled back: not given up (drain first goes on)
    rolled_back = Step(Scale(3, 3, blocked_until=NOW + 300), "rolled_back", "ScaleOutRolledBack", "x")
    kept_on = choose(rolled_back, status)
    assert "nodesPerReplica" not in kept_on and kept_on["widthRetryAfter"] is None, kept_on
    # the written width runs again; a plain tick neither gives up again nor chooses 18 before the time
    after = {"autoscaling": {"decode": {"instances": 3, "serving": 3, **given_up}}}
    events.clear()
    held = choose(Step(Scale(3, 3), ""), after, written)
    assert held["widthHeld"] and "did not come up" in held["widthHeld"], held
    assert held["widthRetryAfter"] == given_up["widthRetryAfter"] and not events
    assert given_up["widthFailures"] == 1


def test_chosen_widths_that_keep_failing_are_retried_ever_more_rarely_and_a_success_starts_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second chosen width in a row that does not come up waits twice as long (12 bootTimes),
    up to 96; a chosen width every instance runs clears the count. A tampered count only lengthens
    the wait up to the cap, and a retry time past the cap is not read."""
    from moe_operator.autoscale.decide import Width
    from moe_operator.autoscale.scale import retry_pause_boots
    from moe_operator.handlers import autoscale_loop

    assert [retry_pause_boots(n) for n in (0, 1, 2, 3, 4, 5, 6, 64)] == [6, 6, 12, 24, 48, 96, 96, 96]
    events, raw, written, chosen, spec, body, decision, stuck = _chosen_18_of_9(monkeypatch)

    def choose(step: Step, pool_status: dict[str, Any], old: frozenset[int]) -> dict[str, Any]:
        st = {"autoscaling": {"decode": pool_status}}
        return autoscale_loop.choose_width(
            body, written, spec, st, None, "decode", decision, step, old, 0, NOW
        )  # type: ignore[arg-type]

    second = choose(stuck, {**chosen, "widthFailures": 1}, frozenset({1, 2}))
    assert second["widthFailures"] == 2 and second["widthRetryAfter"] == codec.write_time(NOW + 12 * 300)
    assert "(2 chosen width(s) in a row)" in events[-1][2] and "bootTime x12" in events[-1][2]
    capped = choose(stuck, {**chosen, "widthFailures": 64}, frozenset({1, 2}))
    assert capped["widthFailures"] == 64 and capped["widthRetryAfter"] == codec.write_time(NOW + 96 * 300)
    # the chosen width rolls on: the count stays; every instance at it: the count goes
    rolling = choose(Step(Scale(3, 3), ""), {**chosen, "widthFailures": 2}, frozenset({2}))
    assert "widthFailures" not in rolling
    ran = choose(Step(Scale(3, 3), ""), {**chosen, "widthFailures": 2}, frozenset())
    assert "widthFailures" in ran and ran["widthFailures"] is None
    # and when a still wider width is chosen on that same tick, the count starts over all the same
    wider = PoolDecision(3, 3, "steady", "", 3, PoolState(instances=3, fits={}), width=Width(36, 288, 1.0))
    raw36 = {**raw, "decode": {**raw["decode"], "autoscaling": {**raw["decode"]["autoscaling"],
                                                                "nodesPerReplicaOptions": [18, 36]}}}  # fmt: skip
    written36 = MoEDeploymentSpec.model_validate(raw36)
    spec36 = running_spec(written36, raw36, {"autoscaling": {"decode": chosen}}, DEFAULT_POLICY, "ns")
    op = SimpleNamespace(platform=DEFAULT_POLICY)
    chose = autoscale_loop.choose_width(
        kopf.Body({**body, "spec": raw36}), written36, spec36,
        {"autoscaling": {"decode": {**chosen, "widthFailures": 2}}},
        op, "decode", wider, Step(Scale(3, 3), ""), frozenset(), 0, NOW,
    )  # type: ignore[arg-type]  # fmt: skip
    assert chose.get("nodesPerReplica") == 36 and chose["widthFailures"] is None, chose
    # a retry time past the longest pause is a tampered one: not read
    far = codec.write_time(NOW + 97 * 300)
    assert codec.read_retry({"widthRetryAfter": far}, NOW, 96 * 300) is None
