"""A snapshot of the cluster's GPU nodes, as the topology planner sees it (pure data)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moe_operator.api import keys as K

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeInfo:
    """One node: its labels, GPUs, and the GPUs that pods of *other* owners already hold."""

    name: str
    labels: Mapping[str, str]
    gpus: int
    used_gpus: int = 0
    ready: bool = True
    schedulable: bool = True
    taints: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    @property
    def free_gpus(self) -> int:
        return max(self.gpus - self.used_gpus, 0)


def _quantity_int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_from_object(node: Mapping[str, Any], used_gpus: int = 0) -> NodeInfo:
    """Turn a Node object (dict, as kopf or the API gives it) into a NodeInfo."""
    meta = node.get("metadata", {})
    status = node.get("status", {})
    spec = node.get("spec", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    return NodeInfo(
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        gpus=_quantity_int(status.get("allocatable", {}).get(GPU_RESOURCE, 0)),
        used_gpus=used_gpus,
        ready=ready,
        schedulable=not spec.get("unschedulable", False),
        taints=tuple(spec.get("taints") or ()),
    )


def pod_gpu_request(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds on its node: the larger of the sum over containers and any init container."""
    spec = pod.get("spec", {})

    def gpus(container: Mapping[str, Any]) -> int:
        res = container.get("resources") or {}
        limits = res.get("limits") or {}
        requests = res.get("requests") or {}
        return _quantity_int(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE, 0)))

    main = sum(gpus(c) for c in spec.get("containers") or ())
    init = max((gpus(c) for c in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def gpu_usage(pods: Iterable[Mapping[str, Any]], exclude_owner_uid: str | None = None) -> dict[str, int]:
    """GPUs held per node by running or pending bound pods, leaving out one owner's pods."""
    usage: dict[str, int] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        phase = pod.get("status", {}).get("phase")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        labels = pod.get("metadata", {}).get("labels") or {}
        if exclude_owner_uid and labels.get(K.DEPLOYMENT_UID) == exclude_owner_uid:
            continue
        usage[node] = usage.get(node, 0) + pod_gpu_request(pod)
    return usage
