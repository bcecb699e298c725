"""Turn index contents into the topology planner's and the lifecycle's inputs (pure)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.api.derived import pool_layout, pools
from moe_operator.lifecycle import GroupState, PodState, StartReport
from moe_operator.recipe import startup_timeout_s
from moe_operator.render import labels as L
from moe_operator.topology.planner import InstanceSite, TopologyPlan
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


MAX_SITE_CHARS = 65536  # 256 node names of at most 253 characters, and the rest
MAX_SITE_NODES = 256


def recorded_site(annotations: Mapping[str, Any]) -> dict[str, Any] | None:
    """A group object's topology annotation (in either format it was written in), parsed; None when
    it has none, or one that is not the operator's shape. Anyone who may edit the object can write
    it: one that does not parse must not stop the deployment's reconciles (the object is applied
    again with the right one), and it cannot place an instance anywhere the planner would not
    (kept sites are checked against the eligible nodes)."""
    raw = annotations.get(K.INSTANCE_NODES) or annotations.get(K.INSTANCE_NODES_BEFORE_0_2)
    if not isinstance(raw, str) or not raw or len(raw) > MAX_SITE_CHARS:
        return None
    try:
        site = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(site, dict):
        return None
    nodes = site.get("nodes")
    fine = (
        site.get("kind") in ("nvlink", "rack", "node")
        and all(isinstance(site.get(k), str) for k in ("label", "domain"))
        and isinstance(nodes, list)
        and 0 < len(nodes) <= MAX_SITE_NODES
        and all(isinstance(n, str) and n for n in nodes)
    )
    return site if fine else None


def previous_sites(groups: Iterable[Mapping[str, Any]], name: str) -> list[InstanceSite]:
    """Where each instance ran, from its group object's (StatefulSet or LeaderWorkerSet) annotation."""
    out = []
    for group in groups:
        prefix = f"{name}-"
        if not group["name"].startswith(prefix):
            continue
        pool, _, index = group["name"][len(prefix) :].rpartition("-")
        if not index.isdigit() or pool not in ("prefill", "decode"):
            continue
        p = recorded_site(group["annotations"])
        if p is None:
            continue
        out.append(InstanceSite(pool, int(index), p["kind"], p["label"], p["domain"], tuple(p["nodes"])))
    return out


def trusted_pods(
    pods: Iterable[dict[str, Any]], group_objects: Iterable[Mapping[str, Any]], name: str
) -> list[dict[str, Any]]:
    """The engine pods that belong to this deployment's groups: created by the StatefulSet of their
    instance (for a LeaderWorkerSet, by the StatefulSets its controller made for it) and named for
    their rank. Labels alone prove nothing: any pod in the namespace can carry them, and an
    impostor taken for a leader would receive pushes with a runtime token, or for a failed rank
    would make the operator restart a group."""
    groups = {g["name"]: g for g in group_objects}
    out = []
    for pod in pods:
        instance = L.instance_name(name, str(pod["pool"]), int(pod["instance"]))
        group, owner, rank = groups.get(instance), pod.get("owner") or {}, int(pod["rank"])
        if group is None or owner.get("kind") != "StatefulSet":
            continue
        if group["kind"] == "StatefulSet":
            ok = owner.get("uid") == group.get("uid") and owner.get("name") == instance
            ok = ok and pod["name"] == f"{instance}-{rank}"
        elif rank == 0:  # LeaderWorkerSet: the leader's StatefulSet is named for the set
            ok = owner.get("name") == instance and pod["name"] == f"{instance}-0"
        else:  # and the workers' for its group 0
            ok = owner.get("name") == f"{instance}-0" and pod["name"] == f"{instance}-0-{rank}"
        if ok:
            out.append(pod)
    return out


def group_states(
    spec: MoEDeploymentSpec,
    name: str,
    group_objects: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    plan: TopologyPlan,
    desired_hashes: Mapping[str, str] | None = None,
    starts: Mapping[tuple[str, int], StartReport] | None = None,
    settled: Collection[str] = (),
    kept: Collection[tuple[str, int]] = (),
) -> list[GroupState]:
    """One GroupState per existing instance group object (StatefulSet or LeaderWorkerSet) that the
    plan keeps. ``desired_hashes`` (instance name -> pod template hash just rendered) is the
    template the group should run, ahead of what the watch has delivered. ``settled``: group objects
    an earlier reconcile applied as now desired, moments ago: they are at their planned site even
    while the watch still shows the old one (else a lagging copy would move or roll them again).
    ``kept``: instances the plan leaves waiting whose group still runs (groups.kept_while_waiting):
    no GroupState, but their nodes count as busy for the others."""
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
                ready_changed=parse_time(pod["readyChanged"]) if pod.get("readyChanged") else None,
            )
        )
    previous = {p.key: p for p in previous_sites(group_objects, name)}
    out = []
    by_name = {g["name"]: g for g in group_objects}
    specs = pools(spec)
    planned = {site.key for site in plan.sites} | set(kept)  # others left out are being removed
    running_on = {k: {p.node for p in states if p.node} for k, states in by_instance.items() if k in planned}
    planned_on = {site.key: set(site.nodes) for site in plan.sites}
    for site in plan.sites:
        obj = by_name.get(L.instance_name(name, site.pool, site.index))
        if obj is None:
            continue
        ann = obj["annotations"]
        old = None if obj["name"] in settled else previous.get(site.key)
        width = pool_layout(specs[site.pool], spec.topology).nodes  # type: ignore[index]
        # a group whose width changes runs at its old width until its roll (its object is held back)
        nnodes = len(old.nodes) if old is not None else width
        others = set().union(*(nodes for key, nodes in running_on.items() if key != site.key))
        wanted = set().union(*(nodes for key, nodes in planned_on.items() if key != site.key))
        out.append(
            GroupState(
                pool=site.pool,
                index=site.index,
                nnodes=nnodes,
                template_hash=(desired_hashes or {}).get(obj["name"]) or ann.get(K.TEMPLATE_HASH, ""),
                epoch=parse_time(ann.get(K.GROUP_EPOCH) or obj["created"]),
                restarts=int(ann.get(K.GROUP_RESTARTS, "0")),
                pods=tuple(sorted(by_instance.get(site.key, []), key=lambda p: p.rank)),
                members=frozenset(filter(None, ann.get(K.GROUP_MEMBERS, "").split(","))),
                moved=old is not None and old.nodes != site.nodes,
                resized_to=width if nnodes != width else 0,
                new_nodes_busy=bool(others & set(site.nodes)),
                in_the_way=bool(running_on.get(site.key, set()) & wanted),
                unready_limit_s=startup_timeout_s(spec),
                start=(starts or {}).get(site.key),
            )
        )
    return out
