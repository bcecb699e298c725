"""Desired children against observed ones: what to apply now, what to hold back, what to prune (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from moe_operator.api import keys as K
from moe_operator.reconcile.observe import recorded_site
from moe_operator.render.compute_domain import COMPUTE_DOMAIN_API_VERSION
from moe_operator.render.group import LWS_API_VERSION
from moe_operator.render.labels import instance_name

ChildKey = tuple[str, str]  # (kind, name)

API_VERSIONS: Mapping[str, str] = {
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "LeaderWorkerSet": LWS_API_VERSION,
    "PodDisruptionBudget": "policy/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "ComputeDomain": COMPUTE_DOMAIN_API_VERSION,
}


def api_version(kind: str) -> str:
    """The apiVersion of a kind the operator owns (core kinds are v1)."""
    return API_VERSIONS.get(kind, "v1")


@dataclass(frozen=True)
class ChildChanges:
    """``apply``: write now. ``hold``: LeaderWorkerSets whose pod template changes, and StatefulSets
    whose width changes, while their group runs, by instance name: applied now, either would change
    the running group at once, so they wait until the lifecycle lets that instance roll.
    ``prune``: rendered earlier, no longer wanted."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    hold: dict[str, dict[str, Any]] = field(default_factory=dict)
    prune: list[ChildKey] = field(default_factory=list)


# What an engine or router pod needs before it is created: its ServiceAccount (admission refuses a
# pod without one, and its controller backs off), its config and token, its NetworkPolicy (no pod
# runs open, not even for a moment) and its IMEX domain. Then the workloads. Then what only
# clients and disruptions need (Services, PodDisruptionBudgets, monitoring).
BEFORE_PODS = frozenset(
    {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret", "NetworkPolicy", "ComputeDomain"}
)
WORKLOADS = frozenset({"StatefulSet", "Deployment", "LeaderWorkerSet"})


def apply_waves(objects: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The objects in the order they are written: what pods need, the workloads, the rest (each
    wave's objects are independent of each other). Empty waves are left out."""
    waves: list[list[dict[str, Any]]] = [[], [], []]
    for obj in objects:
        kind = obj["kind"]
        waves[0 if kind in BEFORE_PODS else 1 if kind in WORKLOADS else 2].append(obj)
    return [w for w in waves if w]


def child_key(obj: Mapping[str, Any]) -> ChildKey:
    return (str(obj["kind"]), str(obj["metadata"]["name"]))


def diff_children(
    desired: Sequence[dict[str, Any]],
    observed: Mapping[ChildKey, Mapping[str, Any]],
    recently_applied: Mapping[ChildKey, str],
    pods: Sequence[Mapping[str, Any]],
) -> ChildChanges:
    """Compare by spec hash. ``recently_applied`` (key -> spec hash applied moments ago) bridges the
    watch lag: an object the index has not delivered yet is not applied again."""
    changes = ChildChanges()
    for obj in desired:
        key = child_key(obj)
        want = obj["metadata"]["annotations"][K.SPEC_HASH]
        have = observed.get(key)
        if have is not None and have["specHash"] == want:
            continue
        if have is None and recently_applied.get(key) == want:
            continue
        if template_change_of_running(obj, have, pods):
            changes.hold[key[1]] = obj
        else:
            changes.apply.append(obj)
    wanted = {child_key(o) for o in desired}
    # Only objects this reconciler rendered (they carry a spec hash) are pruned. While a group is
    # held at its old width, the ComputeDomains of the old plan stay: it may still run in one.
    keep = {"ComputeDomain"} if changes.hold else set()
    changes.prune.extend(
        key for key, c in observed.items() if c["specHash"] and key not in wanted and key[0] not in keep
    )
    return changes


def template_change_of_running(
    obj: Mapping[str, Any], have: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> bool:
    """A LeaderWorkerSet whose pod template changes, or a StatefulSet whose width changes (its
    replicas would be added or removed at once, breaking the running world), while its group
    has pods."""
    if have is None:
        return False
    if obj["kind"] == "LeaderWorkerSet":
        if have["annotations"].get(K.TEMPLATE_HASH) == obj["metadata"]["annotations"][K.TEMPLATE_HASH]:
            return False
    elif obj["kind"] != "StatefulSet" or _width(have["annotations"]) in (
        None,
        _width(obj["metadata"]["annotations"]),
    ):
        return False
    labels = obj["metadata"]["labels"]
    return any(p["pool"] == labels[K.POOL] and str(p["instance"]) == labels[K.INSTANCE] for p in pods)


def _width(annotations: Mapping[str, Any]) -> int | None:
    """Nodes of an instance, from its group object's topology annotation (None when unreadable)."""
    try:
        site = recorded_site(annotations)
        return None if site is None else len(site["nodes"])
    except (KeyError, TypeError, ValueError):
        return None


def keep_instances(changes: ChildChanges, kept: Collection[tuple[str, int]], name: str) -> ChildChanges:
    """``changes`` without pruning the objects of ``kept`` instances (groups.kept_while_waiting) nor,
    while any is kept, a ComputeDomain (the kept group may still run in one)."""
    if not kept:
        return changes
    names = {instance_name(name, pool, index) for pool, index in kept}
    prune = [k for k in changes.prune if k[1] not in names and k[0] != "ComputeDomain"]
    return replace(changes, prune=prune)
