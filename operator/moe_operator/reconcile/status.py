"""The status a reconcile observed, and the events its changes deserve (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    Reason,
    Status,
    get_condition,
    set_condition,
)
from moe_operator.api.derived import pool_layout, pools
from moe_operator.lifecycle import GroupState, is_ready, is_updated
from moe_operator.reconcile.start import starting
from moe_operator.render import labels as L
from moe_operator.topology.planner import TopologyPlan

Verdict = tuple[Status, Reason, str]


@dataclass(frozen=True)
class Event:
    """A Kubernetes event to post on the deployment."""

    type: str  # Normal or Warning
    reason: Reason
    message: str


def pool_status(
    spec: MoEDeploymentSpec,
    name: str,
    groups: Sequence[GroupState],
    restarting: Collection[tuple[str, int]],
    backend: str,
    waiting: Collection[tuple[str, int]] = (),
) -> dict[str, Any]:
    """status.pools: desired, existing, ready and updated instances of each pool, and the ones a
    width change cannot roll yet (``waiting``: the plan has no nodes for them)."""
    out: dict[str, Any] = {}
    for pool, p in pools(spec).items():
        layout = pool_layout(p, spec.topology)
        mine = [g for g in groups if g.pool == pool]
        ready = sum(1 for g in mine if is_ready(g) and (g.pool, g.index) not in restarting)
        out[pool] = {
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
            "starting": starting(groups, pool),
            "widthBlocked": sorted(
                {g.index for g in mine if g.moved and g.resized_to and g.new_nodes_busy}
                | {i for p_, i in waiting if p_ == pool}
            ),
            "outdated": sorted(g.index for g in mine if g.pods and not g.moved and not is_updated(g)),
        }
    return out


def verdicts(
    spec: MoEDeploymentSpec,
    plan: TopologyPlan,
    pools_status: Mapping[str, Mapping[str, Any]],
    router: Mapping[str, Any],
    restarting: Mapping[tuple[str, int], tuple[Reason, str]],
) -> tuple[Verdict, Verdict]:
    """(Ready, Degraded): capacity first, then group restarts, then readiness of pools and router."""
    all_ready = all(s["readyReplicas"] == s["desiredReplicas"] for s in pools_status.values())
    short = ", ".join(f"{pool} {s['ready']}" for pool, s in pools_status.items())
    fine: Verdict = ("False", Reason.AS_EXPECTED, "")
    if plan.waiting:
        w = plan.waiting[0]
        more = f" (and {len(plan.waiting) - 1} more instance(s) waiting)" if len(plan.waiting) > 1 else ""
        return ("False", Reason.WAITING_FOR_CAPACITY, w.message + more), (
            "True",
            Reason.WAITING_FOR_CAPACITY,
            w.message + more,
        )
    if restarting:
        _key, (reason, msg) = next(iter(sorted(restarting.items())))
        degraded: Status = "True" if reason != Reason.ROLLING_OUT else "False"
        return ("False" if not all_ready else "True", reason, msg), (degraded, reason, msg)
    if all(s["desiredReplicas"] == 0 for s in pools_status.values()):
        return ("True", Reason.SCALED_TO_ZERO, "all pools have 0 replicas"), fine
    if not all_ready:
        return ("False", Reason.POOLS_NOT_READY, f"instances ready: {short}"), fine
    if router["readyReplicas"] < min(spec.router.replicas, 1):
        return ("False", Reason.POOLS_NOT_READY, "the router has no ready pod yet"), fine
    return ("True", Reason.ALL_POOLS_READY, f"all instances ready: {short}"), fine


def compute_status(
    spec: MoEDeploymentSpec,
    name: str,
    namespace: str,
    generation: int,
    current: Mapping[str, Any],
    plan: TopologyPlan,
    groups: Sequence[GroupState],
    restarting: Mapping[tuple[str, int], tuple[Reason, str]],
    router_status: Mapping[str, Any] | None,
    now: datetime,
    backend: str = "StatefulSet",
) -> dict[str, Any]:
    """The status this reconcile observed; conditions keep their transition times."""
    pools_status = pool_status(spec, name, groups, restarting, backend, [w.key for w in plan.waiting])
    router: dict[str, Any] = {
        "replicas": int((router_status or {}).get("replicas", 0)),
        "readyReplicas": int((router_status or {}).get("readyReplicas", 0)),
        "endpoint": f"http://{name}-router.{namespace}.svc:{spec.router.port}",
    }
    ready, degraded = verdicts(spec, plan, pools_status, router, restarting)
    progressing: Verdict = (
        ("False", Reason.RECONCILED, "children match the spec")
        if ready[0] == "True" and not restarting
        else ("True", ready[1], ready[2])
    )
    conditions = list(current.get("conditions") or [])
    for type_, (status, reason, message) in (
        (READY, ready),
        (PROGRESSING, progressing),
        (DEGRADED, degraded),
    ):
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "pools": pools_status,
        "router": router,
    }


def stop_status(
    current: Mapping[str, Any], reason: Reason, message: str, generation: int, now: datetime
) -> dict[str, Any]:
    """Nothing can be reconciled: Ready False and Degraded True, saying why; pools stay as reported."""
    conditions = list(current.get("conditions") or [])
    conditions = set_condition(conditions, READY, "False", reason, message, generation, now)
    conditions = set_condition(conditions, DEGRADED, "True", reason, message, generation, now)
    return {"observedGeneration": generation, "conditions": conditions}


def status_changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return any(current.get(k) != v for k, v in desired.items())


def ready_event(
    current: Mapping[str, Any], desired: Mapping[str, Any], posted: Collection[tuple[str, str]]
) -> Event | None:
    """An event when the Ready condition's reason or message changes, unless one was just posted."""
    old = get_condition(current.get("conditions"), READY) or {}
    new = get_condition(desired.get("conditions"), READY)
    if new is None:
        return None
    transition = (str(new["reason"]), str(new["message"]))
    if (old.get("reason"), old.get("message")) == transition or transition in posted:
        return None
    kind = "Warning" if new["reason"] == Reason.WAITING_FOR_CAPACITY else "Normal"
    return Event(kind, Reason(new["reason"]), str(new["message"]))
