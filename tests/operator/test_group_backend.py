"""spec.topology.groupBackend: which backend runs the instances, and what each renders (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from moe_operator.api import keys as K
from moe_operator.lifecycle import GroupState, PodState, formed
from moe_operator.reconcile.backend import recorded_group_backend, resolve_group_backend
from moe_operator.render.children import render_children
from moe_operator.render.group import Owner, RuntimeSettings, leader_address
from render_cases import TWO_CLIQUE_PLAN, gb200_decode_spec

OWNER = Owner("m", "ns", "uid-1")
PLAN = TWO_CLIQUE_PLAN
spec = gb200_decode_spec


@pytest.mark.parametrize(
    ("requested", "recorded", "lws", "expected"),
    [
        ("StatefulSet", None, "served", "StatefulSet"),
        ("StatefulSet", "LeaderWorkerSet", "served", "StatefulSet"),  # an explicit switch is the user's
        ("LeaderWorkerSet", None, "served", "LeaderWorkerSet"),
        ("LeaderWorkerSet", None, "absent", None),  # refused, nothing touched
        ("LeaderWorkerSet", None, "unwatched", None),  # installed after the operator started
        ("auto", None, "served", "LeaderWorkerSet"),
        ("auto", None, "absent", "StatefulSet"),
        ("auto", None, "unwatched", None),  # wait for the restart rather than pick StatefulSet for good
        ("auto", "StatefulSet", "served", "StatefulSet"),  # installing LWS later replaces nothing
        ("auto", "LeaderWorkerSet", "served", "LeaderWorkerSet"),
        ("auto", "LeaderWorkerSet", "absent", None),  # LWS removed under running instances: stop
    ],
)
def test_resolve_group_backend(requested: str, recorded: str | None, lws: Any, expected: str | None) -> None:
    assert resolve_group_backend(requested, recorded, lws) == expected


def test_recorded_group_backend_reads_status_pools() -> None:
    assert recorded_group_backend({}) is None
    assert (
        recorded_group_backend({"pools": {"decode": {"groupBackend": "LeaderWorkerSet"}}})
        == "LeaderWorkerSet"
    )


def test_leaderworkerset_backend_renders_one_single_group_set_per_instance() -> None:
    sts_objs = render_children(spec(), OWNER, PLAN, RuntimeSettings())
    lws_objs = render_children(spec(), OWNER, PLAN, RuntimeSettings(), backend="LeaderWorkerSet")
    kinds = [o["kind"] for o in lws_objs]
    assert kinds.count("LeaderWorkerSet") == 2 and "StatefulSet" not in kinds
    # No headless Service of our own: the controller makes `<instance>` for the leader address.
    instance_services = {o["metadata"]["name"] for o in sts_objs if o["kind"] == "Service"} - {
        o["metadata"]["name"] for o in lws_objs if o["kind"] == "Service"
    }
    assert instance_services == {"m-decode-0", "m-decode-1"}
    sts = next(o for o in sts_objs if o["kind"] == "StatefulSet")
    lws = next(o for o in lws_objs if o["kind"] == "LeaderWorkerSet")
    assert lws["metadata"]["name"] == sts["metadata"]["name"] == "m-decode-0"
    for key in (K.INSTANCE_NODES, K.TEMPLATE_HASH):
        assert lws["metadata"]["annotations"][key] == sts["metadata"]["annotations"][key]
    group = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == 1 and group["size"] == 4
    assert group["restartPolicy"] == "None"  # the operator restarts groups, with backoff
    # Same pods as the StatefulSet backend: pinned to the planned nodes, same leader address.
    assert group["workerTemplate"] == sts["spec"]["template"]
    env = {e["name"]: e.get("value") for e in group["workerTemplate"]["spec"]["containers"][0]["env"]}
    assert (
        env["MOE_LEADER_ADDRESS"]
        == leader_address(OWNER, "decode", 0)
        == "m-decode-0-0.m-decode-0.ns.svc.cluster.local"
    )
    terms = group["workerTemplate"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][-1]["values"] == ["n0-0", "n0-1", "n0-2", "n0-3"]


def _pod(rank: int, template: str) -> PodState:
    now = datetime.now(UTC)
    return PodState(
        f"p{rank}-{template}", f"u{rank}-{template}", rank, "Running", True, 0, now, template, "n"
    )


def test_a_group_forms_only_on_the_current_template() -> None:
    """Just after a roll starts, the old pods still run: recording them would flag the new ones."""
    now = datetime.now(UTC)
    old = GroupState("decode", 0, 2, "new", now, 0, (_pod(0, "old"), _pod(1, "old")))
    assert not formed(old)
    new = GroupState("decode", 0, 2, "new", now, 0, (_pod(0, "new"), _pod(1, "new")))
    assert formed(new)
