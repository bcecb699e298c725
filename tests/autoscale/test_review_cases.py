"""Cases a review of the autoscaler found: each failed before its fix."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import kopf

from moe_operator.autoscale import codec
from moe_operator.autoscale.decide import (
    Objective,
    PoolObservation,
    PoolPolicy,
    PoolState,
    Width,
    decide_pool,
)
from moe_operator.autoscale.model import Fit, update
from moe_operator.autoscale.observe import idle
from moe_operator.autoscale.prior import resume
from moe_operator.autoscale.scale import Scale, advance
from moe_operator.autoscale.signals import InstanceSample
from moe_operator.handlers.autoscale_loop import ROUTER_POD_GONE_S, router_of, router_settled
from moe_operator.handlers.indexes import _child, router_pod

FIT = Fit(base_s=0.03, mu=4.0)
POLICY = PoolPolicy(
    objectives=(Objective("itl", 0.06, 0.9),), min_instances=1, max_instances=20,
    width=Width(nodes=1, gpus=8, kv_tokens=1.0), scale_in_window_s=120, scale_in_cooldown_s=60, boot_s=120,
)  # fmt: skip
NOW = 1_800_000_000.0


def test_a_burst_then_a_plateau_drains_without_undoing_itself() -> None:
    """Scale-in keeps the burst memory, so the drain it starts is not cancelled the next tick."""
    state, scale = PoolState(instances=5, fits={"itl": FIT}), Scale(5, 5)
    events = []
    loads = [8.0] * 20 + [20.0] * 10 + [8.0] * 200
    for i, rate in enumerate(loads):
        serving = scale.serving
        itl = min(FIT.latency(rate / serving), 5.0)
        obs = PoolObservation(30.0 * i, serving, rate, {"itl": itl}, 0.3, 0.0)
        d = decide_pool(POLICY, state, obs)
        state = d.state
        step = advance(
            scale, d.instances, d.need, set(range(scale.instances)), {scale.serving}, 30.0 * i, 120, 600
        )
        scale = step.scale
        state = PoolState(**{**state.__dict__, "instances": scale.instances})
        if step.event:
            events.append(step.event)
    assert "DrainCancelled" not in events, events
    assert events.count("ScaledIn") >= 1


def test_the_load_need_leaves_out_the_spare_capacity_the_need_holds() -> None:
    """``need`` holds the burst reserve and the scale-in window's peak (what a drain must not undo);
    ``load`` is what the load takes now, which MoEAutoscalerAtLimit compares with the instances
    kept: a burst that has passed, capped at maxReplicas, must not read as load going unserved."""
    policy = PoolPolicy(**{**POLICY.__dict__, "max_instances": 4, "scale_in_window_s": 1800.0})
    state = PoolState(instances=4, fits={"itl": FIT})
    loads = []
    for i, rate in enumerate([3.0] * 10 + [20.0] * 4 + [3.0] * 20):
        obs = PoolObservation(30.0 * i, 4, rate, {"itl": min(FIT.latency(rate / 4), 5.0)}, 0.3, 0.0)
        d = decide_pool(policy, state, obs)
        state = PoolState(**{**d.state.__dict__, "instances": d.instances})
        assert d.load <= d.need
        loads.append((d.load, d.need))
    assert max(load for load, _ in loads[10:14]) > 4, loads  # during the burst: more than maxReplicas
    assert loads[-1][0] <= 4 < loads[-1][1], loads  # after it: only the spare capacity asks for more


def test_no_data_cancels_no_drain() -> None:
    draining = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, 300, 600).scale
    assert advance(draining, 3, None, {0, 1, 2}, set(), 30, 300, 600).scale.draining


def test_a_drain_ends_on_idle_only_once_the_router_runs_the_shorter_list() -> None:
    draining = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, 300, 600).scale
    waiting = advance(draining, 2, 2, {0, 1, 2}, {2}, 60, 300, 600, router_settled=False)
    assert waiting.scale.instances == 3
    assert advance(draining, 2, 2, {0, 1, 2}, {2}, 60, 300, 600, router_settled=True).scale.instances == 2
    assert (
        advance(draining, 2, 2, {0, 1, 2}, {2}, 600, 300, 600, router_settled=False).event == "DrainTimedOut"
    )


def test_growth_the_autoscaler_did_not_start_is_timed_and_can_roll_back() -> None:
    raised = Scale(instances=3, serving=2)  # minReplicas raised: status had 2
    first = advance(raised, 3, 3, {0, 1}, set(), 0, 300, 600)
    assert first.scale.pending_since == 0
    assert advance(first.scale, 3, 3, {0, 1}, set(), 601, 300, 600).event == "ScaleOutRolledBack"


def test_a_lowered_max_drains_what_exists_and_tampering_creates_nothing() -> None:
    fallback = Scale(2, 2)
    lowered = codec.read_scale({"instances": 6, "serving": 6}, fallback, 1, 4, NOW, 600, existing=6)
    assert (lowered.instances, lowered.serving) == (6, 6)
    d = decide_pool(
        PoolPolicy(objectives=POLICY.objectives, min_instances=1, max_instances=4, width=POLICY.width),
        PoolState(instances=6, fits={"itl": FIT}),
        PoolObservation(NOW, 6, 6.0, {"itl": 0.04}, 0.3, 0.0),
    )
    assert (d.instances, d.reason) == (5, "max_instances")
    tampered = codec.read_scale({"instances": 200, "serving": 200}, fallback, 1, 4, NOW, 600, existing=2)
    assert tampered.instances == 4


def test_router_settled_reads_the_listing_and_the_rollout() -> None:
    def router(listing: str, **status: int) -> dict:  # type: ignore[type-arg]
        return {"annotations": {"moe.inference.dev/router-workers": listing}, "status": status}

    done = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}
    assert router_settled(router("decode=2", **done), "decode", 2)
    assert not router_settled(router("decode=3", **done), "decode", 2)
    assert not router_settled(router("decode=2", replicas=3, updatedReplicas=1, readyReplicas=2), "decode", 2)
    assert not router_settled(router("decode=2", **done, unavailableReplicas=1), "decode", 2)
    assert not router_settled(None, "decode", 2)
    assert not router_settled(router("garbage", **done), "decode", 2)
    # a width change's instance off the list: settled only once the router runs the list without it
    assert router_settled(router("decode=3-1", **done), "decode", 3, 1)
    assert not router_settled(router("decode=3", **done), "decode", 3, 1)
    assert not router_settled(router("decode=3-1", **done), "decode", 3)


def test_router_settled_waits_for_replaced_router_pods_to_exit() -> None:
    """A replaced router pod still runs the old list (the drained worker on it) until it exits, and
    the Deployment's replicas, updated and ready counts leave it out from its deletion on."""
    listing = {"moe.inference.dev/router-workers": "decode=1"}
    done = {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "observedGeneration": 3}
    settled = {"annotations": listing, "status": done, "generation": 3, "terminatingPods": 0}
    assert router_settled(settled, "decode", 1)
    assert not router_settled({**settled, "terminatingPods": 1}, "decode", 1)
    # the counts are of the previous list's rollout until the controller has seen the new one
    assert not router_settled({**settled, "generation": 4}, "decode", 1)


def test_a_router_scaled_to_zero_settles_once_its_generation_is_observed() -> None:
    """The status leaves counts of 0 out: a router with no pods sends to no instance, so a drain
    ends on the instance's own requests instead of waiting out drainTimeout every time."""
    listing = {"moe.inference.dev/router-workers": "decode=1"}
    zero = {
        "annotations": listing,
        "status": {"observedGeneration": 5},
        "generation": 5,
        "terminatingPods": 0,
    }
    assert router_settled(zero, "decode", 1)
    assert not router_settled({**zero, "generation": 6}, "decode", 1)  # the scale to 0 not yet seen
    assert not router_settled({**zero, "terminatingPods": 1}, "decode", 1)  # a pod still exiting
    # pods counted but not all on the current template or ready: not settled
    rolling = {**zero, "status": {"observedGeneration": 5, "replicas": 1}}
    assert not router_settled(rolling, "decode", 1)
    assert not router_settled({**zero, "status": {"observedGeneration": 5, "replicas": "1"}}, "decode", 1)
    garbage = {"observedGeneration": 5, "replicas": "x", "updatedReplicas": "x", "readyReplicas": "x"}
    assert not router_settled({**zero, "status": garbage}, "decode", 1)  # not counts: not settled


def test_router_of_counts_router_pods_until_they_exit_or_their_grace_has_passed() -> None:
    key, now = ("ns", "m"), 1_000_000.0
    by = codec.write_time(now + 180)  # deleted now, 180 s of grace
    pods = [
        {"name": "old", "deleteBy": by, "phase": "Running"},
        {"name": "new", "deleteBy": None, "phase": "Running"},
        {"name": "done", "deleteBy": by, "phase": "Succeeded"},  # exited: its list runs nowhere
        {"name": "died", "deleteBy": by, "phase": "Failed"},
    ]
    router = {"name": "m-router", "annotations": {}, "status": {}}
    indexes = {"deployment_index": {key: [router, {"name": "x"}]}, "router_pod_index": {key: pods}}
    assert router_of(indexes, key, now) == {**router, "terminatingPods": 1}
    assert router_of(indexes, key, now + 200)["terminatingPods"] == 1  # type: ignore[index]
    # past its grace and a margin: the kubelet killed it, or its node is lost and it never goes
    assert router_of(indexes, key, now + 180 + ROUTER_POD_GONE_S)["terminatingPods"] == 0  # type: ignore[index]
    odd = {
        **indexes,
        "router_pod_index": {key: [{"name": "odd", "deleteBy": "yesterday", "phase": "Running"}]},
    }
    assert router_of(odd, key, now + 1e6)["terminatingPods"] == 1  # type: ignore[index]  # unreadable: held
    assert router_of({**indexes, "deployment_index": {}}, key, now) is None
    assert router_of({**indexes, "router_pod_index": {}}, key, now)["terminatingPods"] == 0  # type: ignore[index]


def test_the_router_pod_index_keeps_what_router_of_reads() -> None:
    pod = {
        "metadata": {
            "name": "m-router-abc", "labels": {"moe.inference.dev/deployment": "m"},
            "deletionTimestamp": "2026-12-06T10:00:00Z",
        },
        "status": {"phase": "Running"},
    }  # fmt: skip
    assert router_pod("m-router-abc", "ns", pod) == {
        ("ns", "m"): {"name": "m-router-abc", "deleteBy": "2026-12-06T10:00:00Z", "phase": "Running"}
    }
    assert router_pod("p", "ns", {"metadata": {"name": "p"}, "status": {}}) is None


def test_a_kv_handoff_in_flight_is_not_idle() -> None:
    def sample(handoff: float) -> InstanceSample:
        return InstanceSample(
            rate=0, running=0, queued=0, handoff=handoff, token_usage=0, ttft=None, itl=None
        )

    assert idle({0: sample(0.0), 1: sample(2.0)}) == frozenset({0})


def test_an_outage_ages_rates_out_but_keeps_the_fit() -> None:
    fit = Fit(0.03, 4.0, sums=(3.0, 3.0, 90.0, 3.0, 90.0), samples=3)
    state = PoolState(instances=2, fits={"itl": fit}, rates=((NOW - 8000, 1.0), (NOW - 10, 2.0)))
    back = codec.read_model(codec.write_model(state), ("itl",), NOW)
    assert back is not None and back.rates == ((NOW - 10, 2.0),) and back.fits["itl"].samples == 3
    doc = json.loads(codec.write_model(state))
    doc["rates"] = [[NOW + 3600, 1.0]]
    assert codec.read_model(json.dumps(doc), ("itl",), NOW) is None  # from the future: not ours


def test_a_width_change_starts_the_fits_over_and_keeps_the_pools_rates() -> None:
    """A person acted on recommendedNodesPerReplica: the curve measured on narrow instances says
    nothing of wide ones (twice the GPUs, more KV room); the pool's rates and surge count requests."""
    measured = update(update(FIT, 1.0, 0.04), 3.0, 0.09)
    narrow = PoolState(instances=4, fits={"itl": measured}, rates=((NOW, 6.0),), surge=2.0, gpus=8)
    obs = PoolObservation(NOW, 4, 6.0, {"itl": 0.05}, 0.9, 0.0)
    same = resume(narrow, POLICY, obs, 4)
    assert same.fits["itl"] == measured and same.gpus == 8
    wide = replace(POLICY, width=Width(nodes=2, gpus=16, kv_tokens=2.0))
    after = resume(codec.read_model(codec.write_model(narrow), ("itl",), NOW), wide, obs, 2)
    assert after.fits["itl"].samples == 0 and after.fits["itl"] != measured
    assert after.rates == narrow.rates and after.surge == narrow.surge and after.gpus == 16
    assert after.instances == 2
    # a model stored before the width was recorded (gpus 0) keeps its fits
    legacy = resume(replace(narrow, gpus=0), wide, obs, 2)
    assert legacy.fits["itl"] == measured and legacy.gpus == 16


def test_load_that_rises_while_a_width_change_rolls_still_scales_out() -> None:
    """The curve does not learn from instances of two widths, and the prior set when the width
    changed is not re-anchored on each of those intervals either: re-anchored, it followed the load,
    so no load looked like more than the pool could take and only a breach added an instance."""
    wide = replace(POLICY, width=Width(nodes=2, gpus=16, kv_tokens=2.0))
    state = PoolState(instances=4, fits={"itl": update(FIT, 1.0, 0.04)}, gpus=8)
    decisions = []
    for i, rate in enumerate([4.0, 6.0, 10.0, 16.0]):
        obs = PoolObservation(NOW + 30 * i, 4, rate, {"itl": 0.05}, 0.3, 0.0, one_width=False)
        d = decide_pool(wide, resume(state, wide, obs, state.instances), obs)
        assert d.state.fits["itl"].samples == 0  # nothing learned from the mixed pool
        decisions.append(d)
        state = d.state
    assert decisions[0].state.fits == decisions[-1].state.fits  # the prior of the width change, kept
    assert decisions[-1].reason == "scale_out" and decisions[-1].instances > 4
    assert "does not run the spec's number of ranks" in decisions[-1].message


def test_child_summaries_keep_the_generation_router_settled_compares() -> None:
    raw: Any = {
        "metadata": {
            "name": "m-router",
            "uid": "u",
            "generation": 7,
            "labels": {"moe.inference.dev/deployment": "m"},
        },
        "status": {"observedGeneration": 6},
    }
    body = kopf.Body(raw)
    summary = _child("Deployment", "m-router", "ns", body)
    assert summary is not None and summary[("ns", "m")]["generation"] == 7
