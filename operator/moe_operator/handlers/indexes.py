"""kopf in-memory indexes: nodes, GPU use per node, and the pods and children of each deployment.

Reconciles read these instead of calling the API, so a reconcile with nothing to change
sends no request at all. The index functions are async (cheap and pure): kopf then runs them
on its event loop instead of queueing every watch event behind slow reconciles in its thread
pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import kopf

from moe_operator.api import keys as K
from moe_operator.topology.snapshot import pod_gpu_request

MANAGED = MappingProxyType({"app.kubernetes.io/managed-by": K.MANAGED_BY})


@kopf.index("nodes")
async def node_index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """name -> the Node object's parts the planner reads."""
    return {
        name: {
            "metadata": {"name": name, "labels": dict(body.metadata.labels or {})},
            "spec": {
                "unschedulable": body.spec.get("unschedulable", False),
                "taints": body.spec.get("taints"),
            },
            "status": {
                "allocatable": dict(body.status.get("allocatable") or {}),
                "conditions": [
                    {"type": c.get("type"), "status": c.get("status")}
                    for c in body.status.get("conditions") or []
                ],
            },
        }
    }


@kopf.index("pods")
async def gpu_use_index(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[str, Any] | None:
    """nodeName -> (owning deployment uid or "", GPUs) for every bound pod still holding GPUs."""
    node = spec.get("nodeName")
    if not node or status.get("phase") in ("Succeeded", "Failed"):
        return None
    gpus = pod_gpu_request(body)
    if not gpus:
        return None
    return {node: ((body.metadata.labels or {}).get(K.DEPLOYMENT_UID, ""), gpus)}


@kopf.index("pods", labels=MANAGED)
async def engine_pod_index(
    name: str, namespace: str | None, body: kopf.Body, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[Any, Any] | None:
    """(namespace, deployment) -> engine pod summaries."""
    labels = body.metadata.labels or {}
    deployment = labels.get(K.DEPLOYMENT)
    if not deployment or K.INSTANCE not in labels:
        return None
    statuses = status.get("containerStatuses") or []
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    owner: dict[str, Any] = next(
        (o for o in body.metadata.get("ownerReferences") or [] if o.get("controller")), {}
    )
    return {
        (namespace, deployment): {
            "name": name,
            "uid": body.metadata.uid,
            "pool": labels.get(K.POOL),
            "instance": int(labels[K.INSTANCE]),
            "rank": int(labels.get("apps.kubernetes.io/pod-index", "0")),
            "phase": status.get("phase", "Pending"),
            "ready": ready.get("status") == "True",
            "readyChanged": ready.get("lastTransitionTime"),
            "restarts": sum(int(c.get("restartCount", 0)) for c in statuses),
            "created": body.metadata.get("creationTimestamp"),
            "deleting": body.metadata.get("deletionTimestamp") is not None,
            "templateHash": (body.metadata.annotations or {}).get(K.TEMPLATE_HASH, ""),
            # eplb mode static: the placement version it booted with (its template's)
            "bootPlacement": str((body.metadata.annotations or {}).get(K.BOOT_PLACEMENT, "")),
            "node": spec.get("nodeName"),
            "ip": status.get("podIP"),
            # the controller that created it: engine pods are trusted only when it is theirs
            "owner": {"kind": owner.get("kind"), "name": owner.get("name"), "uid": owner.get("uid")},
        }
    }


@kopf.index("pods", labels={**MANAGED, K.COMPONENT: "router"})
async def router_pod_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    return router_pod(name, namespace, body)


def router_pod(name: str, namespace: str | None, body: Mapping[str, Any]) -> dict[Any, Any] | None:
    """(namespace, deployment) -> router pods. A replaced router pod still sends to the workers of
    its old list until it exits, and the Deployment's counts leave it out once it terminates."""
    meta = body.get("metadata") or {}
    deployment = (meta.get("labels") or {}).get(K.DEPLOYMENT)
    if not deployment:
        return None
    return {
        (namespace, deployment): {
            "name": name,
            "deleteBy": meta.get("deletionTimestamp"),  # the deletion time plus its grace
            "phase": (body.get("status") or {}).get("phase"),
        }
    }


def _child(kind: str, name: str, namespace: str | None, body: kopf.Body) -> dict[Any, Any] | None:
    labels = body.metadata.labels or {}
    deployment = labels.get(K.DEPLOYMENT)
    if not deployment:
        return None
    annotations = body.metadata.annotations or {}
    return {
        (namespace, deployment): {
            "kind": kind,
            "name": name,
            "uid": body.metadata.uid,
            "specHash": annotations.get(K.SPEC_HASH),
            "annotations": dict(annotations),
            "created": body.metadata.get("creationTimestamp"),
            "generation": body.metadata.get("generation"),
            "status": dict(body.get("status") or {}),
        }
    }


# One index per kind the operator owns: (namespace, deployment) -> [child summaries].
@kopf.index("statefulsets", labels=MANAGED)
async def statefulset_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    return _child("StatefulSet", name, namespace, body)


@kopf.index("deployments", labels=MANAGED)
async def deployment_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    return _child("Deployment", name, namespace, body)


@kopf.index("services", labels=MANAGED)
async def service_index(name: str, namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    return _child("Service", name, namespace, body)


@kopf.index("configmaps", labels=MANAGED)
async def configmap_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    return _child("ConfigMap", name, namespace, body)


@kopf.index("serviceaccounts", labels=MANAGED)
async def serviceaccount_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    return _child("ServiceAccount", name, namespace, body)


@kopf.index("leaderworkersets.leaderworkerset.x-k8s.io", labels=MANAGED)
async def leaderworkerset_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    """kopf watches this only while the LeaderWorkerSet CRD exists (it logs once when it does not)."""
    return _child("LeaderWorkerSet", name, namespace, body)


LEADERWORKERSET_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
COMPUTEDOMAIN_CRD = "computedomains.resource.nvidia.com"
# Optional APIs the operator uses when the cluster serves them: CRD name -> the kind it serves.
OPTIONAL_CRDS = MappingProxyType(
    {
        LEADERWORKERSET_CRD: "LeaderWorkerSet",
        "podmonitors.monitoring.coreos.com": "PodMonitor",
        "prometheusrules.monitoring.coreos.com": "PrometheusRule",
        COMPUTEDOMAIN_CRD: "ComputeDomain",
    }
)
OPTIONAL_VERSIONS = MappingProxyType({COMPUTEDOMAIN_CRD: "v1beta1"})
"""The version the operator writes, where it is not v1."""


@kopf.index("customresourcedefinitions.apiextensions.k8s.io")
async def optional_api_index(name: str, body: kopf.Body, **_: Any) -> dict[str, bool] | None:
    """Optional CRDs (LeaderWorkerSet, the Prometheus Operator's) -> whether they serve v1 now.

    A watch, not a lookup per reconcile: installing or removing a controller is seen in seconds.
    """
    if name not in OPTIONAL_CRDS:
        return None
    established = any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in body.get("status", {}).get("conditions") or []
    )
    version = OPTIONAL_VERSIONS.get(name, "v1")
    served = any(
        v.get("name") == version and v.get("served") for v in body.get("spec", {}).get("versions") or []
    )
    return {name: established and served and not body.metadata.get("deletionTimestamp")}


@kopf.index("podmonitors.monitoring.coreos.com", labels=MANAGED)
async def podmonitor_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    """Watched only while the Prometheus Operator's CRDs exist (spec.monitoring)."""
    return _child("PodMonitor", name, namespace, body)


@kopf.index("prometheusrules.monitoring.coreos.com", labels=MANAGED)
async def prometheusrule_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    return _child("PrometheusRule", name, namespace, body)


@kopf.index("computedomains.resource.nvidia.com", labels=MANAGED)
async def computedomain_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    """Watched only while NVIDIA's DRA driver CRD exists (GB200 NVL72 hardware profiles)."""
    return _child("ComputeDomain", name, namespace, body)


@kopf.index("poddisruptionbudgets.policy", labels=MANAGED)
async def pdb_index(name: str, namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    return _child("PodDisruptionBudget", name, namespace, body)


@kopf.index("networkpolicies.networking.k8s.io", labels=MANAGED)
async def networkpolicy_index(
    name: str, namespace: str | None, body: kopf.Body, **_: Any
) -> dict[Any, Any] | None:
    """Watched also while --no-network-policy: policies rendered earlier are then pruned."""
    return _child("NetworkPolicy", name, namespace, body)


CHILD_INDEXES = (
    "statefulset_index",
    "deployment_index",
    "service_index",
    "configmap_index",
    "serviceaccount_index",
    "pdb_index",
    "networkpolicy_index",
    "leaderworkerset_index",
    "podmonitor_index",
    "prometheusrule_index",
    "computedomain_index",
)


def served_kinds(index: Any) -> frozenset[str]:
    """From optional_api_index: the optional kinds whose CRD serves v1 now."""
    return frozenset(kind for crd, kind in OPTIONAL_CRDS.items() if any(index.get(crd, ())))
