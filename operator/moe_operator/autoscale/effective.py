"""The size the reconciler renders: the autoscaler's, for the pools it scales (pure).

For a pool with autoscaling.mode Operator, status.autoscaling holds the instances to keep and
how many of them the router lists; spec.<pool>.replicas is only where the pool starts. A
status that is missing or unreadable (restored from a backup, edited by hand) falls back to
the spec's size inside the bounds, never to zero.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..api.derived import Pool, pools
from ..api.spec import MoEDeploymentSpec
from ..api.types import parse_duration
from .codec import read_scale
from .policy import scaled_pools
from .scale import Scale, initial


def pool_scales(
    spec: MoEDeploymentSpec, status: Mapping[str, Any], now: float, existing: Mapping[str, int] | None = None
) -> dict[Pool, Scale]:
    """Each scaled pool's size as status holds it (or where it starts). ``existing``: instances
    per pool that exist now (a lowered maxReplicas drains them rather than cutting them)."""
    auto = status.get("autoscaling")
    auto = auto if isinstance(auto, Mapping) else {}
    out: dict[Pool, Scale] = {}
    for name, a in scaled_pools(spec).items():
        fallback = initial(pools(spec)[name].replicas, a.min_replicas, a.max_replicas)
        raw = auto.get(name)
        horizon = parse_duration(a.boot_time)
        if isinstance(raw, Mapping):
            have = (existing or {}).get(name, 0)
            out[name] = read_scale(raw, fallback, a.min_replicas, a.max_replicas, now, horizon, have)
        else:
            out[name] = fallback
    return out


def existing_instances(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Instances per pool that have pods now (the highest index + 1), from the engine pod index."""
    out: dict[str, int] = {}
    for p in pods:
        try:
            pool, index = str(p["pool"]), int(p["instance"])
        except (KeyError, TypeError, ValueError):
            continue
        out[pool] = max(out.get(pool, 0), min(max(index, 0), 255) + 1)
    return out


def effective_spec(
    spec: MoEDeploymentSpec, status: Mapping[str, Any], now: float, existing: Mapping[str, int] | None = None
) -> tuple[MoEDeploymentSpec, dict[str, int]]:
    """The spec with the autoscaler's instance counts, and the router's list length per scaled pool."""
    return sized_spec(spec, pool_scales(spec, status, now, existing))


def sized_spec(
    spec: MoEDeploymentSpec, scales: Mapping[Pool, Scale]
) -> tuple[MoEDeploymentSpec, dict[str, int]]:
    """effective_spec from the pools' scales already read."""
    if not scales:
        return spec, {}
    update: dict[str, Any] = {
        name: pools(spec)[name].model_copy(update={"replicas": s.instances}) for name, s in scales.items()
    }
    return spec.model_copy(update=update), {name: s.serving for name, s in scales.items()}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def applied_widths(spec: MoEDeploymentSpec, status: Mapping[str, Any]) -> dict[str, int]:
    """Per scaled pool with widthChanges Apply: the width the autoscaler chose, while the spec's own
    width is still the one it replaced. Anything else in status (a width outside
    nodesPerReplicaOptions, one chosen over another spec width) is not the operator's choice."""
    auto = status.get("autoscaling")
    auto = auto if isinstance(auto, Mapping) else {}
    out: dict[str, int] = {}
    for name, a in scaled_pools(spec).items():
        raw = auto.get(name)
        if a.width_changes != "Apply" or not isinstance(raw, Mapping):
            continue
        width, was = raw.get("nodesPerReplica"), raw.get("nodesPerReplicaFrom")
        written = pools(spec)[name].nodes_per_replica
        if _count(width) and _count(was) and was == written != width and width in a.nodes_per_replica_options:
            out[name] = width
    return out


def with_widths(
    raw_spec: Mapping[str, Any],
    widths: Mapping[str, int],
    problems: Callable[[dict[str, Any]], Sequence[object]],
) -> dict[str, Any] | None:
    """The spec as written with the autoscaler's widths, when ``problems`` (admission's rules) find
    none in it; None: run the spec as written."""
    if not widths:
        return None
    out = copy.deepcopy(dict(raw_spec))
    for pool, width in widths.items():
        out[pool] = {**out[pool], "nodesPerReplica": width}
    return None if problems(out) else out
