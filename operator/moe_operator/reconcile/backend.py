"""What runs a deployment's instances: StatefulSets or LeaderWorkerSets (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from moe_operator.api.conditions import Reason
from moe_operator.render.group import GroupBackend

LeaderWorkerSetState = Literal["absent", "unwatched", "served"]


def leaderworkerset_state(served: bool, watched: bool) -> LeaderWorkerSetState:
    """``served``: the cluster serves leaderworkerset.x-k8s.io/v1 now; ``watched``: it did when the
    operator started (kopf watches only what discovery listed then)."""
    if not served:
        return "absent"
    return "served" if watched else "unwatched"


def resolve_group_backend(
    requested: str, recorded: str | None, leaderworkerset: LeaderWorkerSetState
) -> GroupBackend | None:
    """What runs the instances: the spec's choice, or for auto the one recorded in status at the
    first reconcile (installing LeaderWorkerSet later must not replace running instances), else
    LeaderWorkerSet when the cluster has it. None: LeaderWorkerSet is wanted (or, for a new auto
    deployment, installed) but not usable: not served, or installed after the operator started
    ("unwatched"), so the operator cannot see the sets yet."""
    if requested == "StatefulSet" or (requested == "auto" and recorded == "StatefulSet"):
        return "StatefulSet"
    wanted = requested == "LeaderWorkerSet" or recorded == "LeaderWorkerSet"
    if wanted or leaderworkerset != "absent":
        return "LeaderWorkerSet" if leaderworkerset == "served" else None
    return "StatefulSet"


def recorded_group_backend(status: Mapping[str, Any]) -> str | None:
    """The group backend status reports for the deployment's pools (written by earlier reconciles)."""
    for pool in (status.get("pools") or {}).values():
        if isinstance(pool, dict) and pool.get("groupBackend"):
            return str(pool["groupBackend"])
    return None


def backend_unavailable(requested: str, leaderworkerset: LeaderWorkerSetState) -> tuple[Reason, str]:
    """Why no backend can run the instances (resolve_group_backend gave None), and what to do."""
    if leaderworkerset == "unwatched":
        return Reason.LEADERWORKERSET_NOT_WATCHED, (
            "LeaderWorkerSet was installed after the operator started, so the operator does "
            "not watch LeaderWorkerSets yet: restart the operator (for example kubectl -n "
            "moe-system rollout restart deployment/moe-operator)"
        )
    return Reason.LEADERWORKERSET_NOT_INSTALLED, (
        "the instances are to run as LeaderWorkerSets (spec.topology.groupBackend "
        f"{requested}), but the cluster does not serve "
        "leaderworkerset.x-k8s.io/v1: install the LeaderWorkerSet controller, or set "
        "spec.topology.groupBackend to StatefulSet (that replaces every running instance)"
    )
