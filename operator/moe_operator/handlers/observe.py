"""Turn index contents into the pure planner's and lifecycle's inputs, and compute status (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.conditions import set_condition
from moe_operator.api.derived import pool_layout, pools
from moe_operator.lifecycle import GroupState, PodState, is_ready, is_updated
from moe_operator.render import labels as L
from moe_operator.topology.planner import Placement, TopologyPlan
from moe_operator.topology.snapshot import NodeInfo, node_from_object


def parse_time(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC)
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def node_snapshot(
    nodes: Iterable[Mapping[str, Any]],
    gpu_use: Mapping[str, Iterable[tuple[str, int]]],
    own_uid: str,
    claims: Mapping[str, int] | None = None,
) -> list[NodeInfo]:
    """Nodes with the GPUs other owners hold: bound pods, or GPUs other deployments' plans
    claimed on the node before their pods exist (whichever is larger), so two deployments
    planned in the same burst do not pick the same nodes."""
    out = []
    for node in nodes:
        name = node["metadata"]["name"]
        used = sum(g for uid, g in gpu_use.get(name, ()) if uid != own_uid)
        out.append(node_from_object(node, max(used, (claims or {}).get(name, 0))))
    return out


def previous_placements(groups: Iterable[Mapping[str, Any]], name: str) -> list[Placement]:
    """Where each instance ran, from its group object's (StatefulSet or LeaderWorkerSet) annotation."""
    out = []
    for group in groups:
        raw = group["annotations"].get(L.PLACEMENT)
        prefix = f"{name}-"
        if not raw or not group["name"].startswith(prefix):
            continue
        pool, _, index = group["name"][len(prefix) :].rpartition("-")
        if not index.isdigit() or pool not in ("prefill", "decode"):
            continue
        p = json.loads(raw)
        out.append(Placement(pool, int(index), p["kind"], p["label"], p["domain"], tuple(p["nodes"])))
    return out


def group_states(
    spec: MoEDeploymentSpec,
    name: str,
    group_objects: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    plan: TopologyPlan,
    desired_hashes: Mapping[str, str] | None = None,
) -> list[GroupState]:
    """One GroupState per existing instance group object (StatefulSet or LeaderWorkerSet) that the
    plan keeps. ``desired_hashes`` (instance name -> pod template hash just rendered) is the
    template the group should run, ahead of what the watch has delivered."""
    by_instance: dict[tuple[str, int], list[PodState]] = {}
    for pod in pods:
        if pod["deleting"]:
            continue
        by_instance.setdefault((pod["pool"], pod["instance"]), []).append(
            PodState(
                name=pod["name"],
                uid=pod["uid"],
                rank=pod["rank"],
                phase=pod["phase"],
                ready=pod["ready"],
                restarts=pod["restarts"],
                created=parse_time(pod["created"]),
                template_hash=pod["templateHash"],
                node=pod["node"],
            )
        )
    previous = {p.key: p for p in previous_placements(group_objects, name)}
    out = []
    by_name = {g["name"]: g for g in group_objects}
    specs = pools(spec)
    for placement in plan.placements:
        obj = by_name.get(L.instance_name(name, placement.pool, placement.index))
        if obj is None:
            continue
        ann = obj["annotations"]
        old = previous.get(placement.key)
        out.append(
            GroupState(
                pool=placement.pool,
                index=placement.index,
                nnodes=pool_layout(specs[placement.pool], spec.topology).nodes,  # type: ignore[index]
                template_hash=(desired_hashes or {}).get(obj["name"]) or ann.get(L.TEMPLATE_HASH, ""),
                epoch=parse_time(ann.get(L.GROUP_EPOCH) or obj["created"]),
                restarts=int(ann.get(L.GROUP_RESTARTS, "0")),
                pods=tuple(sorted(by_instance.get(placement.key, []), key=lambda p: p.rank)),
                members=frozenset(filter(None, ann.get(L.GROUP_MEMBERS, "").split(","))),
                moved=old is not None and old.nodes != placement.nodes,
            )
        )
    return out


def compute_status(
    spec: MoEDeploymentSpec,
    name: str,
    namespace: str,
    generation: int,
    current: Mapping[str, Any],
    plan: TopologyPlan,
    groups: Sequence[GroupState],
    restarting: Mapping[tuple[str, int], tuple[str, str]],
    router_status: Mapping[str, Any] | None,
    now: datetime,
    backend: str = "StatefulSet",
) -> dict[str, Any]:
    """The status this reconcile observed; conditions keep their transition times."""
    pools_status: dict[str, Any] = {}
    for pool, p in pools(spec).items():
        layout = pool_layout(p, spec.topology)
        mine = [g for g in groups if g.pool == pool]
        ready = sum(1 for g in mine if is_ready(g) and (g.pool, g.index) not in restarting)
        pools_status[pool] = {
            "desiredReplicas": p.replicas,
            "replicas": len(mine),
            "readyReplicas": ready,
            "updatedReplicas": sum(1 for g in mine if is_updated(g)),
            "ready": f"{ready}/{p.replicas}",
            "selector": ",".join(f"{k}={v}" for k, v in sorted(L.pool_selector(name, pool).items())),
            "epSize": layout.ep_size,
            "attentionTensorParallel": layout.attention_tp,
            "groupBackend": backend,
            "groupRestarts": sum(g.restarts for g in mine),
        }
    router: dict[str, Any] = {
        "replicas": int((router_status or {}).get("replicas", 0)),
        "readyReplicas": int((router_status or {}).get("readyReplicas", 0)),
        "endpoint": f"http://{name}-router.{namespace}.svc:{spec.router.port}",
    }

    conditions = list(current.get("conditions") or [])
    all_ready = all(s["readyReplicas"] == s["desiredReplicas"] for s in pools_status.values())
    router_ready = router["readyReplicas"] >= min(spec.router.replicas, 1)
    if plan.waiting:
        w = plan.waiting[0]
        more = f" (and {len(plan.waiting) - 1} more instance(s) waiting)" if len(plan.waiting) > 1 else ""
        ready_c = ("False", "WaitingForCapacity", w.message + more)
        degraded = ("True", "WaitingForCapacity", w.message + more)
    elif restarting:
        _key, (reason, msg) = next(iter(sorted(restarting.items())))
        ready_c = ("False" if not all_ready else "True", reason, msg)
        degraded = ("True" if reason != "RollingOut" else "False", reason, msg)
    elif not all_ready:
        short = ", ".join(f"{pool} {s['ready']}" for pool, s in pools_status.items())
        ready_c = ("False", "PoolsNotReady", f"instances ready: {short}")
        degraded = ("False", "AsExpected", "")
    elif not router_ready:
        ready_c = ("False", "PoolsNotReady", "the router has no ready pod yet")
        degraded = ("False", "AsExpected", "")
    else:
        short = ", ".join(f"{pool} {s['ready']}" for pool, s in pools_status.items())
        ready_c = ("True", "AllPoolsReady", f"all instances ready: {short}")
        degraded = ("False", "AsExpected", "")
    progressing = (
        ("False", "Reconciled", "children match the spec")
        if ready_c[0] == "True" and not restarting
        else ("True", ready_c[1], ready_c[2])
    )
    for type_, (status, reason, message) in (
        ("Ready", ready_c),
        ("Progressing", progressing),
        ("Degraded", degraded),
    ):
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)  # type: ignore[arg-type]
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "pools": pools_status,
        "router": router,
    }


def status_changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return any(current.get(k) != v for k, v in desired.items())
