"""The reconciler's decisions without a cluster: diff, group actions, status, backend messages."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from moe_contract.auth import instance_token, parse_digests, token_matches
from moe_operator.api import keys as K
from moe_operator.api.conditions import Reason, get_condition
from moe_operator.lifecycle import GroupState, PodState
from moe_operator.reconcile.backend import backend_unavailable, leaderworkerset_state
from moe_operator.reconcile.children import diff_children
from moe_operator.reconcile.groups import WidthGate, group_actions
from moe_operator.reconcile.observe import group_states, previous_sites, trusted_pods
from moe_operator.reconcile.status import compute_status, pool_status, ready_event, stop_status
from moe_operator.reconcile.token import instance_of, key_of
from moe_operator.render.children import render_children
from moe_operator.render.group import Owner, RuntimeSettings
from moe_operator.render.shared import token_secret
from moe_operator.topology.planner import TopologyPlan, Waiting
from render_cases import TWO_CLIQUE_PLAN, clique_plan, gb200_decode_spec

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OWNER = Owner("m", "ns", "uid-1")


def _observed(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (o["kind"], o["metadata"]["name"]): {
            "kind": o["kind"],
            "name": o["metadata"]["name"],
            "specHash": o["metadata"]["annotations"][K.SPEC_HASH],
            "annotations": dict(o["metadata"]["annotations"]),
        }
        for o in objs
    }


def _desired(backend: str = "StatefulSet", mode: str = "operator") -> list[dict[str, Any]]:
    return render_children(
        gb200_decode_spec(mode), OWNER, TWO_CLIQUE_PLAN, RuntimeSettings(), backend=backend
    )  # type: ignore[arg-type]


def _pod(rank: int, instance: int = 0) -> dict[str, Any]:
    return {"pool": "decode", "instance": instance, "rank": rank}


def test_nothing_to_write_when_every_hash_matches() -> None:
    desired = _desired()
    changes = diff_children(desired, _observed(desired), {}, [])
    assert not changes.apply and not changes.hold and not changes.prune


def test_new_children_applied_unless_applied_moments_ago() -> None:
    desired = _desired()
    changes = diff_children(desired, {}, {}, [])
    assert len(changes.apply) == len(desired)
    recent = {(o["kind"], o["metadata"]["name"]): o["metadata"]["annotations"][K.SPEC_HASH] for o in desired}
    assert not diff_children(desired, {}, recent, []).apply


def test_children_no_longer_planned_are_pruned_but_foreign_objects_are_not() -> None:
    desired = _desired()
    observed = _observed(desired)
    observed[("StatefulSet", "m-decode-7")] = {
        "kind": "StatefulSet",
        "name": "m-decode-7",
        "specHash": "x",
        "annotations": {},
    }
    observed[("ConfigMap", "m-decode-placement")] = {
        "kind": "ConfigMap",
        "name": "m-decode-placement",
        "specHash": None,
        "annotations": {},
    }
    assert diff_children(desired, observed, {}, []).prune == [("StatefulSet", "m-decode-7")]


def test_leaderworkerset_template_change_is_held_while_its_group_runs() -> None:
    old = _desired("LeaderWorkerSet")
    new = _desired("LeaderWorkerSet", mode="engine")  # a different engine config: new template hash
    observed = _observed(old)
    held = diff_children(new, observed, {}, [_pod(0, instance=1)])
    assert set(held.hold) == {"m-decode-1"}
    assert "m-decode-0" in {o["metadata"]["name"] for o in held.apply if o["kind"] == "LeaderWorkerSet"}
    idle = diff_children(new, observed, {}, [])
    assert not idle.hold


def test_a_statefulset_changing_width_is_held_while_its_group_runs() -> None:
    """Applied at once, its new replica count would add or remove ranks of a running world."""
    old = _desired()
    wide = render_children(gb200_decode_spec(), OWNER, WIDE_PLAN, RuntimeSettings())
    observed = _observed(old)
    held = diff_children(wide, observed, {}, [_pod(0, instance=1)])
    assert set(held.hold) == {"m-decode-1"}
    assert "m-decode-0" in {o["metadata"]["name"] for o in held.apply if o["kind"] == "StatefulSet"}
    same_width = _desired(mode="engine")  # a new template at the same width: applied (OnDelete rolls it)
    assert not diff_children(same_width, observed, {}, [_pod(0, instance=1)]).hold
    # the held group may still run in an NVLink domain of the old plan: its ComputeDomain stays
    observed[("ComputeDomain", "m-cd-old")] = {
        "kind": "ComputeDomain",
        "name": "m-cd-old",
        "specHash": "x",
        "annotations": {},
    }
    assert ("ComputeDomain", "m-cd-old") not in diff_children(wide, observed, {}, [_pod(0, instance=1)]).prune
    assert ("ComputeDomain", "m-cd-old") in diff_children(wide, observed, {}, []).prune


def _wide_group_objects(spec: Any) -> list[dict[str, Any]]:
    """The StatefulSets of WIDE_PLAN (8 nodes per instance) as the group index holds them."""
    old = render_children(spec, OWNER, WIDE_PLAN, RuntimeSettings())
    return [
        {"kind": o["kind"], "name": o["metadata"]["name"], "annotations": o["metadata"]["annotations"],
         "created": "2026-12-01T11:00:00Z"}
        for o in old
        if o["kind"] == "StatefulSet"
    ]  # fmt: skip


def test_a_group_object_applied_moments_ago_is_at_its_planned_site() -> None:
    """A reconcile that still sees the old width in the watch would roll the group a second time."""
    spec = gb200_decode_spec()
    objects = _wide_group_objects(spec)
    lagging = group_states(spec, "m", objects, [], TWO_CLIQUE_PLAN)
    assert [(g.moved, g.nnodes, g.resized_to) for g in lagging] == [(True, 8, 4), (True, 8, 4)]
    settled = group_states(spec, "m", objects, [], TWO_CLIQUE_PLAN, settled={"m-decode-0"})
    assert [(g.moved, g.nnodes, g.resized_to) for g in settled] == [(False, 4, 0), (True, 8, 4)]


WIDE_PLAN = clique_plan(8)


def _group(index: int, *, ready: bool = True, template: str = "t1", restarts: int = 0, phase: str = "Running",
           node: str | None = "n0", members: frozenset[str] = frozenset()) -> GroupState:  # fmt: skip
    pods = tuple(
        PodState(
            f"p{index}-{r}", f"u{index}-{r}", r, phase, ready, restarts if r == 0 else 0, NOW, template, node
        )
        for r in range(2)
    )
    return GroupState("decode", index, 2, "t1", NOW - timedelta(hours=1), 0, pods, members=members)


def test_a_failed_rank_restarts_its_whole_group_and_orphans_on_gone_nodes_are_named() -> None:
    broken = _group(0, phase="Failed", node="gone")
    actions = group_actions([broken, _group(1)], NOW, nodes={"n0"})
    (restart,) = actions.restarts
    assert restart.group.index == 0 and restart.reason == Reason.GROUP_RESTARTING
    assert restart.orphans == ("p0-0", "p0-1") and restart.restarts == 1
    assert set(actions.restarting) == {("decode", 0)}


def test_spec_rolls_one_instance_at_a_time() -> None:
    stale = [_group(0, template="t0"), _group(1, template="t0")]
    actions = group_actions(stale, NOW, nodes={"n0"})
    assert [(r.group.index, r.reason) for r in actions.restarts] == [(0, Reason.ROLLING_OUT)]
    assert actions.restarts[0].restarts == 0  # a roll is not a failure: the count stays


def test_an_autoscaled_width_change_rolls_only_the_instance_the_autoscaler_drained() -> None:
    """Instances the router lists (or a scale-in drains) wait for the width change's drain; one past
    them (booting) rolls as before, and so does one that never formed its world (pending); a width
    change that cannot wait (its new nodes busy, or in another's way) waits for the drain as well."""
    formed = [
        replace(_group(i, members=frozenset({f"u{i}-0", f"u{i}-1"})), moved=True, resized_to=4)
        for i in range(3)
    ]
    held = group_actions(formed, NOW, nodes={"n0"}, gates={"decode": WidthGate(2)})
    assert [r.group.index for r in held.restarts] == [2]  # not listed: serves nothing
    draining = group_actions(formed, NOW, nodes={"n0"}, gates={"decode": WidthGate(3)})
    assert draining.restarts == []  # the one a scale-in drains finishes first, then goes
    released = group_actions(formed[:2], NOW, nodes={"n0"}, gates={"decode": WidthGate(2, 1)})
    assert [(r.group.index, r.reason) for r in released.restarts] == [(1, Reason.ROLLING_OUT)]
    # briefly unready but formed: still held (the router may send it requests)
    blip = [formed[0], replace(formed[1], pods=_group(1, ready=False).pods)]
    assert group_actions(blip, NOW, nodes={"n0"}, gates={"decode": WidthGate(2)}).restarts == []
    pending = replace(_group(0, ready=False, phase="Pending"), moved=True, resized_to=4)
    assert [r.group.index for r in group_actions([pending, formed[1]], NOW, nodes={"n0"},
                                                  gates={"decode": WidthGate(2)}).restarts] == [0]  # fmt: skip
    # one whose new nodes another instance runs, and the one in its way, wait for their drain too:
    # in a full cluster the width change goes on only as the autoscaler releases them
    busy = [replace(formed[0], new_nodes_busy=True), replace(formed[1], in_the_way=True)]
    assert group_actions(busy, NOW, nodes={"n0"}, gates={"decode": WidthGate(2)}).restarts == []
    forced = group_actions(busy, NOW, nodes={"n0"}, gates={"decode": WidthGate(2, 0)})
    assert [(r.group.index, r.reason) for r in forced.restarts] == [(0, Reason.ROLLING_OUT)]
    assert "drained first" in forced.restarts[0].message and forced.restarts[0].restarts == 0  # not a failure
    # without the autoscaler (no gate) both restart at once, as before
    ungated = group_actions(busy, NOW, nodes={"n0"})
    assert sorted(r.group.index for r in ungated.restarts) == [0, 1]
    other_pool = group_actions(formed[:2], NOW, nodes={"n0"}, gates={"prefill": WidthGate(2)})
    assert [r.group.index for r in other_pool.restarts] == [0]  # the gate is per pool


def test_an_autoscaled_spec_roll_rolls_only_the_instance_the_autoscaler_drained() -> None:
    """A spec change other than the width (a new pod template at the same width): in an autoscaled
    pool the instances the router lists wait for their drain like a width change's, the released one
    rolls, one past them rolls as before; without a gate the pool rolls one at a time undrained. The
    reconciler lists them in status.pools.<pool>.outdated for the autoscaler."""
    stale = [_group(i, template="t0", members=frozenset({f"u{i}-0", f"u{i}-1"})) for i in range(3)]
    held = group_actions(stale, NOW, nodes={"n0"}, gates={"decode": WidthGate(2)})
    assert [(r.group.index, r.reason) for r in held.restarts] == [(2, Reason.ROLLING_OUT)]
    assert group_actions(stale[:2], NOW, nodes={"n0"}, gates={"decode": WidthGate(2)}).restarts == []
    released = group_actions(stale[:2], NOW, nodes={"n0"}, gates={"decode": WidthGate(2, 1)})
    assert [(r.group.index, r.reason) for r in released.restarts] == [(1, Reason.ROLLING_OUT)]
    assert released.restarts[0].restarts == 0  # a roll, not a failure
    ungated = group_actions(stale[:2], NOW, nodes={"n0"})
    assert [r.group.index for r in ungated.restarts] == [0]
    # ready but with no world recorded (its template changed while its pods were pending): it may
    # serve, so it is held all the same; one pending is not
    unrecorded = [_group(0, template="t0"), _group(1, template="t0")]
    assert group_actions(unrecorded, NOW, nodes={"n0"}, gates={"decode": WidthGate(2)}).restarts == []
    pending = [_group(0, template="t0", ready=False, phase="Pending"), _group(1, template="t0")]
    assert [r.group.index for r in group_actions(pending, NOW, nodes={"n0"},
                                                  gates={"decode": WidthGate(2)}).restarts] == [0]  # fmt: skip
    # a broken one restarts at once whatever the gate (its world is gone: nothing to drain)
    broken = replace(_group(0, template="t0", phase="Failed"), members=stale[0].members)
    assert [r.reason for r in group_actions([broken, stale[1]], NOW, nodes={"n0"},
                                            gates={"decode": WidthGate(2)}).restarts] == [Reason.GROUP_RESTARTING]  # fmt: skip
    spec = gb200_decode_spec()
    listed = pool_status(
        spec, "m", [stale[0], _group(1), replace(stale[2], moved=True, resized_to=4)], (), "StatefulSet"
    )
    assert listed["decode"]["outdated"] == [0]  # not the one at its new width's turn: that is a width change


def test_a_width_change_rolls_one_instance_at_a_time_onto_free_nodes() -> None:
    """Each group keeps running at its old width until its turn; one planned onto nodes another
    instance still runs, and the one running there, restart at once and say why."""
    resized = [replace(_group(i), moved=True, resized_to=4) for i in range(2)]
    actions = group_actions(resized, NOW, nodes={"n0"})
    assert [(r.group.index, r.reason) for r in actions.restarts] == [(0, Reason.ROLLING_OUT)]
    assert "rolling from 2 to 4 nodes" in actions.restarts[0].message
    assert actions.restarts[0].restarts == 0  # a roll is not a failure
    # the next one waits while the first is not ready at its new width
    booting = replace(_group(0, ready=False), nnodes=4)
    assert group_actions([booting, resized[1]], NOW, nodes={"n0"}).restarts == []
    assert [r.group.index for r in group_actions([_group(0), resized[1]], NOW, nodes={"n0"}).restarts] == [1]
    # one group planned onto nodes another still runs restarts at once (its turn could not come
    # while it cannot start), and it is the pool's one instance down: the others wait for it
    one_busy = [
        resized[0],
        replace(resized[1], new_nodes_busy=True),
        replace(_group(2), moved=True, resized_to=4),
    ]
    actions = group_actions(one_busy, NOW, nodes={"n0"})
    assert [(r.group.index, r.reason) for r in actions.restarts] == [(1, Reason.GROUP_RESTARTING)]
    assert (
        "its width changes (2 -> 4 nodes) onto nodes other instances still run" in actions.restarts[0].message
    )
    # the group holding those nodes restarts at once too (it would roll only after the one waiting
    # for its nodes is ready: never); the rest roll on
    holder = [replace(resized[0], in_the_way=True), replace(resized[1], new_nodes_busy=True), one_busy[2]]
    actions = group_actions(holder, NOW, nodes={"n0"})
    assert [(r.group.index, r.reason) for r in actions.restarts] == [
        (0, Reason.GROUP_RESTARTING),
        (1, Reason.GROUP_RESTARTING),
    ]
    assert "another instance is planned onto the nodes it runs on" in actions.restarts[0].message
    # a new instance (not resized) planned onto a resized group's nodes: only the holder restarts
    pending_new = replace(_group(2, ready=False, phase="Pending"), new_nodes_busy=True)
    actions = group_actions(
        [replace(resized[0], in_the_way=True), resized[1], pending_new], NOW, nodes={"n0"}
    )
    assert [(r.group.index, r.reason) for r in actions.restarts] == [(0, Reason.GROUP_RESTARTING)]
    # the same across pools: a new prefill instance planned onto decode instance 1's nodes restarts
    # that one instance; decode instance 0 keeps serving and rolls after it
    other_pool = replace(_group(0, ready=False, phase="Pending"), pool="prefill", new_nodes_busy=True)
    actions = group_actions([resized[0], replace(resized[1], in_the_way=True), other_pool], NOW, nodes={"n0"})
    assert [(r.group.pool, r.group.index, r.reason) for r in actions.restarts] == [
        ("decode", 1, Reason.GROUP_RESTARTING)
    ]
    # a group not yet rolled whose node is gone restarts at once, as any moved group
    lost = group_actions(
        [_group(0), replace(_group(1, node="gone"), moved=True, resized_to=4)], NOW, nodes={"n0"}
    )
    assert [(r.group.index, r.reason) for r in lost.restarts] == [(1, Reason.GROUP_RESTARTING)]
    assert "the planner moved the instance" in lost.restarts[0].message
    # a group moved for another reason (its node went away) restarts at once
    moved = group_actions([replace(_group(0), moved=True)], NOW, nodes={"n0"})
    assert "the planner moved the instance" in moved.restarts[0].message
    # a resized group that is broken anyway restarts at once too
    failed = replace(_group(0, phase="Failed"), moved=True, resized_to=4)
    assert (
        group_actions([failed, resized[1]], NOW, nodes={"n0"}).restarts[0].reason == Reason.GROUP_RESTARTING
    )


def test_an_instance_that_is_not_ready_rolls_without_waiting_for_itself() -> None:
    """It serves nothing, so rolling it costs no capacity; the ready one waits for it."""
    pending = _group(0, ready=False, phase="Pending", template="t0")
    actions = group_actions([pending, _group(1, template="t0")], NOW, nodes={"n0"})
    assert [(r.group.index, r.reason) for r in actions.restarts] == [(0, Reason.ROLLING_OUT)]
    # ... but not while another instance of the pool is down: it may be only briefly unready, and the
    # router may still send it requests
    resized = replace(_group(2, ready=False), moved=True, resized_to=4)
    booting = _group(1, ready=False, template="t1")
    assert group_actions([_group(0), booting, resized], NOW, nodes={"n0"}).restarts == []


def test_a_formed_world_gets_its_members_recorded_once() -> None:
    fresh = group_actions([_group(0)], NOW, nodes={"n0"})
    assert fresh.members == [(fresh.members[0][0], "u0-0,u0-1")]
    recorded = group_actions([_group(0, members=frozenset({"u0-0", "u0-1"}))], NOW, nodes={"n0"})
    assert not recorded.members


def _status(plan: TopologyPlan, groups: list[GroupState], replicas: int = 2, **kw: Any) -> dict[str, Any]:
    spec = gb200_decode_spec()
    spec.decode.replicas = replicas
    router = {"replicas": 1, "readyReplicas": 1}
    return compute_status(
        spec, "m", "ns", 3, kw.get("current", {}), plan, groups, kw.get("restarting", {}), router, NOW
    )


def test_status_ready_and_waiting_for_capacity() -> None:
    ready = _status(TWO_CLIQUE_PLAN, [_group(0), _group(1)])
    cond = get_condition(ready["conditions"], "Ready")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == Reason.ALL_POOLS_READY
    assert ready["pools"]["decode"]["ready"] == "2/2"
    waiting = TopologyPlan(
        TWO_CLIQUE_PLAN.sites[:1], (Waiting("decode", 1, "WaitingForCapacity", "8 GPUs short"),)
    )
    status = _status(waiting, [_group(0)])
    assert get_condition(status["conditions"], "Degraded")["reason"] == Reason.WAITING_FOR_CAPACITY  # type: ignore[index]
    event = ready_event(ready, status, posted=set())
    assert event is not None and event.type == "Warning" and "8 GPUs short" in event.message
    assert ready_event(status, status, posted=set()) is None  # no change, no event


def test_all_pools_at_zero_replicas_is_scaled_to_zero() -> None:
    status = _status(TopologyPlan((), ()), [], replicas=0)
    cond = get_condition(status["conditions"], "Ready")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", Reason.SCALED_TO_ZERO)


def test_stop_status_keeps_transition_times_and_names_the_reason() -> None:
    first = stop_status({}, Reason.INVALID_SPEC, "spec.decode.replicas: too many", 2, NOW)
    again = stop_status(
        first, Reason.INVALID_SPEC, "spec.decode.replicas: too many", 2, NOW + timedelta(minutes=5)
    )
    assert first == again
    assert get_condition(first["conditions"], "Degraded")["status"] == "True"  # type: ignore[index]


def test_backend_messages_say_what_to_do() -> None:
    assert leaderworkerset_state(served=True, watched=False) == "unwatched"
    reason, message = backend_unavailable("auto", "unwatched")
    assert reason == Reason.LEADERWORKERSET_NOT_WATCHED and "restart the operator" in message
    reason, message = backend_unavailable("LeaderWorkerSet", "absent")
    assert reason == Reason.LEADERWORKERSET_NOT_INSTALLED and "groupBackend to StatefulSet" in message


def test_a_rank_unready_past_the_startup_budget_restarts_the_group_with_a_stable_message() -> None:
    hung = PodState(
        "p0-1",
        "u0-1",
        1,
        "Running",
        False,
        0,
        NOW - timedelta(hours=2),
        "t1",
        "n0",
        NOW - timedelta(minutes=31),
    )
    fine = PodState("p0-0", "u0-0", 0, "Running", True, 0, NOW - timedelta(hours=2), "t1", "n0")
    group = GroupState("decode", 0, 2, "t1", NOW - timedelta(hours=1), 0, (fine, hung), unready_limit_s=1800)
    (restart,) = group_actions([group], NOW, nodes={"n0"}).restarts
    assert "p0-1 (rank 1) stayed unready longer than spec.engine.startupTimeout (1800s)" in restart.message
    recent = PodState(
        "p0-1",
        "u0-1",
        1,
        "Running",
        False,
        0,
        NOW - timedelta(hours=2),
        "t1",
        "n0",
        NOW - timedelta(minutes=5),
    )
    waiting = GroupState(
        "decode", 0, 2, "t1", NOW - timedelta(hours=1), 0, (fine, recent), unready_limit_s=1800
    )
    assert not group_actions([waiting], NOW, nodes={"n0"}).restarts
    # after a restart the budget counts from the new epoch, not from the old unready time
    restarted = GroupState(
        "decode", 0, 2, "t1", NOW - timedelta(minutes=10), 1, (fine, hung), unready_limit_s=1800
    )
    assert not group_actions([restarted], NOW, nodes={"n0"}).restarts


def _engine_pod(name: str, rank: int, owner: dict[str, Any] | None, instance: int = 0) -> dict[str, Any]:
    return {"name": name, "pool": "decode", "instance": instance, "rank": rank, "owner": owner or {}}


def test_only_pods_created_for_the_instance_are_trusted() -> None:
    sts = [{"kind": "StatefulSet", "name": "m-decode-0", "uid": "sts-uid"}]
    own = {"kind": "StatefulSet", "name": "m-decode-0", "uid": "sts-uid"}
    pods = [
        _engine_pod("m-decode-0-0", 0, own),
        _engine_pod("m-decode-0-1", 1, own),
        _engine_pod("leader", 0, None),  # a bare pod with the right labels
        _engine_pod("m-decode-0-0x", 0, own),  # named for no rank
        _engine_pod("m-decode-0-1", 1, {"kind": "StatefulSet", "name": "m-decode-0", "uid": "forged"}),
        _engine_pod("m-decode-1-0", 0, {"kind": "StatefulSet", "name": "m-decode-1", "uid": "x"}, instance=1),
        _engine_pod("m-decode-0-0", 0, {"kind": "ReplicaSet", "name": "m-decode-0", "uid": "sts-uid"}),
    ]
    trusted = trusted_pods(pods, sts, "m")
    assert [(p["name"], p["owner"].get("uid")) for p in trusted] == [
        ("m-decode-0-0", "sts-uid"),
        ("m-decode-0-1", "sts-uid"),
    ]


def test_leaderworkerset_pods_are_trusted_by_their_controllers_statefulsets() -> None:
    lws = [{"kind": "LeaderWorkerSet", "name": "m-decode-0", "uid": "lws-uid"}]
    pods = [
        _engine_pod("m-decode-0-0", 0, {"kind": "StatefulSet", "name": "m-decode-0", "uid": "a"}),
        _engine_pod("m-decode-0-0-1", 1, {"kind": "StatefulSet", "name": "m-decode-0-0", "uid": "b"}),
        _engine_pod(
            "m-decode-0-1", 1, {"kind": "StatefulSet", "name": "m-decode-0", "uid": "a"}
        ),  # not a worker name
    ]
    assert [p["name"] for p in trusted_pods(pods, lws, "m")] == ["m-decode-0-0", "m-decode-0-0-1"]


def test_a_topology_annotation_that_is_not_the_operators_is_no_site_and_stops_nothing() -> None:
    """Anyone who may edit a group object can rewrite its topology annotation: one that does not parse
    or has another shape is read as no recorded site for that instance alone (before, it raised and
    every reconcile of the deployment failed), and the others' sites stay."""
    good = json.dumps({"kind": "node", "label": "kubernetes.io/hostname", "domain": "n1", "nodes": ["n1"]})
    bad = [
        "not json", "[1]", "null", json.dumps({"kind": "node"}), "[" * 100_000 + "]" * 100_000,
        json.dumps({"kind": "elsewhere", "label": "l", "domain": "d", "nodes": ["n"]}),
        json.dumps({"kind": "node", "label": "l", "domain": "d", "nodes": "n1"}),
        json.dumps({"kind": "node", "label": "l", "domain": "d", "nodes": [{"$ne": 1}]}),
        json.dumps({"kind": "node", "label": "l", "domain": "d", "nodes": []}),
        json.dumps({"kind": "node", "label": 7, "domain": "d", "nodes": ["n"]}),
    ]  # fmt: skip
    groups = [{"name": "m-decode-0", "annotations": {K.INSTANCE_NODES: good}}] + [
        {"name": f"m-decode-{i + 1}", "annotations": {K.INSTANCE_NODES: raw}} for i, raw in enumerate(bad)
    ]
    sites = previous_sites(groups, "m")
    assert [(s.pool, s.index, s.nodes) for s in sites] == [("decode", 0, ("n1",))]


def test_a_key_secret_counts_only_when_this_deployment_owns_it_and_it_is_well_formed() -> None:
    owner = {"ownerReferences": [{"uid": "uid-1", "controller": True}]}
    rendered = token_secret(Owner("m", "ns", "uid-1"), bytes(range(32)))["stringData"]
    data = {k: base64.b64encode(v.encode()).decode() for k, v in rendered.items()}
    mine = {"metadata": owner, "data": data}
    assert key_of(mine, "uid-1") == bytes(range(32))
    assert key_of(mine, "uid-2") is None  # someone else's deployment
    assert key_of({"metadata": {}, "data": data}, "uid-1") is None  # made by hand under the name
    assert key_of({"metadata": {"ownerReferences": [{"uid": "uid-1"}]}, "data": data}, "uid-1") is None
    b64 = base64.b64encode
    for bad in (
        {},
        {"token": "c2VjcmV0"},  # an older operator's shared token: replaced, never used
        {**data, "key": "!!!"},
        {**data, "key": b64(b"abcd").decode()},  # too short
        {**data, "key": b64(b"zz" * 32).decode()},  # not hex
        {"key": data["key"]},  # no digests for the pods
    ):
        assert key_of({"metadata": owner, "data": bad}, "uid-1") is None, bad
    assert key_of(None, "uid-1") is None
    # The digests open each instance with its own token only; the pods never see the key.
    digests = parse_digests(rendered["digests.json"])
    assert len(digests) == 2 * 256 and bytes(range(32)).hex() not in rendered["digests.json"]
    pod = {"pool": "decode", "instance": 3}
    assert token_matches(digests, "m-decode-3", instance_token(bytes(range(32)), instance_of(pod, "m")))
    assert not token_matches(digests, "m-decode-2", instance_token(bytes(range(32)), instance_of(pod, "m")))


def test_a_group_another_instance_is_planned_onto_is_in_the_way() -> None:
    """Instance 1 narrows onto nodes instance 0 runs at its old width: 1's new nodes are busy and
    0 is in the way (it restarts at once rather than wait for a turn that 1 blocks)."""
    spec = gb200_decode_spec()
    objects = _wide_group_objects(spec)
    site0, site1 = TWO_CLIQUE_PLAN.sites
    plan = replace(TWO_CLIQUE_PLAN, sites=(site0, replace(site1, nodes=("n0-4", "n0-5", "n0-6", "n0-7"))))
    pods = [
        {"name": f"m-decode-{i}-{r}", "uid": f"u{i}{r}", "pool": "decode", "instance": i, "rank": r,
         "phase": "Running", "ready": True, "restarts": 0, "created": "2026-12-01T11:00:00Z",
         "templateHash": "t", "node": f"n{i}-{r}", "deleting": False}
        for i in range(2)
        for r in range(8)
    ]  # fmt: skip
    zero, one = group_states(spec, "m", objects, pods, plan)
    assert (zero.in_the_way, zero.new_nodes_busy) == (True, False)
    assert (one.in_the_way, one.new_nodes_busy) == (False, True)
    apart = group_states(spec, "m", objects, pods, TWO_CLIQUE_PLAN)  # each narrows onto its own nodes
    assert not any(g.in_the_way or g.new_nodes_busy for g in apart)
    # instance 0 left out of the plan but kept (it still serves): its nodes are busy for instance 1
    only_one = replace(plan, sites=plan.sites[1:], waiting=(Waiting("decode", 0, "WaitingForCapacity", ""),))
    assert [g.index for g in group_states(spec, "m", objects, pods, only_one)] == [1]
    assert not group_states(spec, "m", objects, pods, only_one)[0].new_nodes_busy  # left out: being removed
    (kept_one,) = group_states(spec, "m", objects, pods, only_one, kept={("decode", 0)})
    assert kept_one.new_nodes_busy
    # status: a width change cannot roll instance 1 (busy) nor instance 0 (no nodes planned)
    status = compute_status(
        spec, "m", "ns", 3, {}, only_one, [kept_one], {}, {"replicas": 1, "readyReplicas": 1}, NOW
    )
    assert status["pools"]["decode"]["widthBlocked"] == [0, 1]
    assert _status(TWO_CLIQUE_PLAN, [_group(0), _group(1)])["pools"]["decode"]["widthBlocked"] == []


def test_a_serving_instance_the_new_width_leaves_no_room_for_keeps_its_group_until_released() -> None:
    """Six nodes, two autoscaled instances of two nodes widened to four: the plan places instance 0
    and leaves instance 1 waiting. Instance 1 still serves at its old width, so its group is not
    pruned until the autoscaler drained and released it; a pool without the autoscaler, a node that
    is gone, or an instance that is not listed changes nothing."""
    from moe_operator.reconcile.children import ChildChanges, keep_instances
    from moe_operator.reconcile.groups import kept_while_waiting
    from moe_operator.topology.planner import InstanceSite, PoolRequest, TopologyPolicy, plan_topology
    from moe_operator.topology.snapshot import NodeInfo

    zone = "topology.kubernetes.io/zone"
    nodes = [NodeInfo(f"n{i}", {zone: "z"}, 8) for i in range(6)]
    before = [InstanceSite("decode", i, "rack", zone, "z", (f"n{2 * i}", f"n{2 * i + 1}")) for i in range(2)]
    plan = plan_topology([PoolRequest("decode", 2, 4, 8)], nodes, TopologyPolicy(nvlink_label=None), before)
    assert [w.key for w in plan.waiting] == [("decode", 1)]
    names = {n.name for n in nodes}

    pods = [
        {"pool": "decode", "instance": i, "rank": r, "phase": "Running", "ready": True, "restarts": 0,
         "node": f"n{2 * i + r}", "deleting": False}
        for i in range(2) for r in range(2)
    ]  # fmt: skip

    def kept(
        gates: dict[str, WidthGate], exist: set[str] = names, ranks: list[dict[str, Any]] = pods
    ) -> frozenset[tuple[str, int]]:
        return kept_while_waiting(plan.waiting, gates, before, {"decode": 4}, ranks, exist)

    assert kept({"decode": WidthGate(2)}) == {("decode", 1)}
    assert kept({"decode": WidthGate(2, 1)}) == frozenset()  # drained and released: it may go
    assert kept({"decode": WidthGate(1)}) == frozenset()  # not listed (booting or beyond the list)
    assert kept({}) == frozenset()  # not autoscaled: as before
    assert kept({"decode": WidthGate(2)}, names - {"n3"}) == frozenset()  # its node is gone
    same = kept_while_waiting(plan.waiting, {"decode": WidthGate(2)}, before, {"decode": 2}, pods, names)
    assert same == frozenset()  # not a width change
    # one that breaks (a rank restarted, or missing) goes as before: it serves nothing whole
    restarted = [dict(p, restarts=1) if (p["instance"], p["rank"]) == (1, 1) else p for p in pods]
    assert kept({"decode": WidthGate(2)}, ranks=restarted) == frozenset()
    assert kept({"decode": WidthGate(2)}, ranks=pods[:3]) == frozenset()

    prune = [("StatefulSet", "m-decode-1"), ("Service", "m-decode-1"), ("ComputeDomain", "m-decode-1-cd"),
             ("StatefulSet", "m-decode-7")]  # fmt: skip
    left = keep_instances(ChildChanges(prune=prune), {("decode", 1)}, "m")
    assert left.prune == [("StatefulSet", "m-decode-7")]
    assert keep_instances(ChildChanges(prune=prune), frozenset(), "m").prune == prune
