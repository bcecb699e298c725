"""One engine instance = one pod group: a StatefulSet (one pod per node) and a headless Service,
or one LeaderWorkerSet of a single group (its controller makes the StatefulSets and the Service)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from moe_contract import pod as P
from moe_contract.auth import DIGESTS_FILE
from moe_contract.pod import ENGINE_CONFIG_DIR, PLACEMENT_DIR, RUNTIME_DIR, TOKEN_DIR
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.api.derived import Pool, pool_layout, pools
from moe_operator.api.names import API_VERSION, KIND
from moe_operator.recipe import effective_env
from moe_operator.recipe.derive import KERNEL_CACHE_DIR, KERNEL_CACHE_NODE_ENV
from moe_operator.render import labels as L
from moe_operator.render.compute_domain import pod_claims
from moe_operator.render.engine_container import (
    INIT_RESOURCES,
    RESTRICTED_CONTAINER,
    SECCOMP_RUNTIME_DEFAULT,
    engine_ports,
    engine_probes,
    engine_resources,
    engine_security_context,
    low_port_sysctls,
    termination_grace_seconds,
)
from moe_operator.render.network import NetworkSettings
from moe_operator.topology.planner import InstanceSite

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"

GroupBackend = Literal["StatefulSet", "LeaderWorkerSet"]


@dataclass(frozen=True)
class Owner:
    """The MoEDeployment that owns every child (garbage collection deletes them with it)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class RuntimeSettings:
    """Operator-level settings of what runs in engine pods (not per MoEDeployment)."""

    runtime_image: str = "ghcr.io/moe-inference/moe-runtime:0.1.0"
    network: NetworkSettings = field(default_factory=NetworkSettings)


def engine_config_name(name: str, pool: str) -> str:
    return f"{name}-{pool}-engine"


def placement_config_name(name: str, pool: str) -> str:
    return f"{name}-{pool}-placement"


def token_secret_name(name: str) -> str:
    return f"{name}-runtime-token"


def service_account_name(name: str) -> str:
    return f"{name}-runtime"


def kernel_cache_node_env(spec: MoEDeploymentSpec) -> list[dict[str, Any]]:
    """The node's name for the kernel cache's per-node directory (unless the spec's env names it)."""
    names = {e.get("name") for e in spec.engine.env}
    if not spec.engine.kernel_cache_claim or KERNEL_CACHE_NODE_ENV in names:
        return []
    return [_field_env(KERNEL_CACHE_NODE_ENV, "spec.nodeName")]


def leader_address(owner: Owner, pool: str, index: int) -> str:
    inst = L.instance_name(owner.name, pool, index)
    return f"{inst}-0.{inst}.{owner.namespace}.svc.cluster.local"


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _sysctls(sysctls: list[dict[str, str]]) -> dict[str, Any]:
    return {"sysctls": sysctls} if sysctls else {}


def pod_template(
    spec: MoEDeploymentSpec,
    owner: Owner,
    pool: Pool,
    site: InstanceSite,
    settings: RuntimeSettings,
    compute_domain: bool = False,
) -> dict[str, Any]:
    """The pod of every rank of one instance: all the node's GPUs, pinned to the planned nodes.
    ``compute_domain``: the pod claims its NVLink domain's IMEX channel (render.compute_domain)."""
    p = pools(spec)[pool]
    layout = pool_layout(p, spec.topology)
    topo = spec.topology
    resources = engine_resources(spec)

    ports = engine_ports(spec, pool)
    mounts = [
        {"name": "runtime", "mountPath": RUNTIME_DIR, "readOnly": True},
        {"name": "engine-config", "mountPath": ENGINE_CONFIG_DIR, "readOnly": True},
        {"name": "placement", "mountPath": PLACEMENT_DIR, "readOnly": True},
        {"name": "runtime-token", "mountPath": TOKEN_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "runtime", "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": "engine-config", "configMap": {"name": engine_config_name(owner.name, pool)}},
        # The control loop publishes placements; pods start without one (trivial placement).
        {
            "name": "placement",
            "configMap": {"name": placement_config_name(owner.name, pool), "optional": True},
        },
        {
            "name": "runtime-token",  # only the digests: the key, which derives every token, stays out
            "secret": {
                "secretName": token_secret_name(owner.name),
                "items": [{"key": DIGESTS_FILE, "path": DIGESTS_FILE}],
            },
        },
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.engine.shared_memory_size}},
    ]
    if spec.engine.kernel_cache_claim:
        volumes.append(
            {"name": "kernel-cache", "persistentVolumeClaim": {"claimName": spec.engine.kernel_cache_claim}}
        )
        mounts.append({"name": "kernel-cache", "mountPath": KERNEL_CACHE_DIR})
    if spec.model.volume is not None and spec.model.path:
        volumes.append({"name": "model", **copy.deepcopy(spec.model.volume)})
        mounts.append({"name": "model", "mountPath": spec.model.path, "readOnly": True})

    env = [
        _env("PYTHONPATH", RUNTIME_DIR),
        _env(P.ENV_ROLE, pool if spec.prefill else "standalone"),
        _env(P.ENV_INSTANCE, L.instance_name(owner.name, pool, site.index)),
        _field_env(P.ENV_RANK, "metadata.labels['apps.kubernetes.io/pod-index']"),
        _env(P.ENV_NNODES, str(layout.nodes)),
        _env(P.ENV_LEADER_ADDRESS, leader_address(owner, pool, site.index)),
        _field_env(P.ENV_POD_IP, "status.podIP"),
        _field_env(P.ENV_POD_NAME, "metadata.name"),
        _env(P.ENV_ENGINE_CONFIG, P.DEFAULT_CONFIG_PATH),
        *kernel_cache_node_env(spec),  # before the cache directory that expands it
        *effective_env(spec, pool),  # the recipe's (fabric, DeepEP cap), unless spec.engine.env sets them
        *copy.deepcopy(spec.engine.env),
    ]
    affinity_terms = [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": list(site.nodes)},
    ]
    if site.kind != "node":
        affinity_terms.insert(0, {"key": site.label, "operator": "In", "values": [site.domain]})

    pod_spec: dict[str, Any] = {
        # A ServiceAccount bound to nothing, and no token: the runtime reads its placement from the
        # mounted ConfigMap and never calls the Kubernetes API.
        "serviceAccountName": service_account_name(owner.name),
        "automountServiceAccountToken": False,
        "securityContext": {
            **SECCOMP_RUNTIME_DEFAULT,
            **_sysctls(low_port_sysctls([int(p["containerPort"]) for p in ports], topo.host_network)),
        },
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "enableServiceLinks": False,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": affinity_terms}]
                }
            }
        },
        "tolerations": copy.deepcopy(topo.tolerations),
        "initContainers": [
            {
                "name": "install-runtime",
                "image": settings.runtime_image,
                "command": ["sh", "-c", f"cp -r {RUNTIME_DIR}/. {RUNTIME_DIR}-target/"],
                "volumeMounts": [{"name": "runtime", "mountPath": f"{RUNTIME_DIR}-target"}],
                "resources": copy.deepcopy(INIT_RESOURCES),
                "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
            }
        ],
        "containers": [
            {
                "name": "engine",
                "image": spec.engine.image,
                "imagePullPolicy": spec.engine.image_pull_policy,
                "command": ["python3", "-m", "moe_runtime.cli", "launch"],
                "env": env,
                "ports": ports,
                "resources": resources,
                "volumeMounts": mounts,
                "securityContext": engine_security_context(spec),
                **engine_probes(spec),
            }
        ],
        "volumes": volumes,
    }
    if compute_domain and site.kind == "nvlink" and len(site.nodes) > 1:
        pod_spec["resourceClaims"], resources["claims"] = pod_claims(owner.name, site.domain)
    if spec.engine.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.engine.image_pull_secrets]
    if topo.node_selector:
        pod_spec["nodeSelector"] = dict(topo.node_selector)
    if topo.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return pod_spec


def instance_objects(
    spec: MoEDeploymentSpec,
    owner: Owner,
    pool: Pool,
    site: InstanceSite,
    settings: RuntimeSettings,
    engine_config_hash: str,
    boot_placement: int = 0,
    backend: GroupBackend = "StatefulSet",
    compute_domain: bool = False,
) -> list[dict[str, Any]]:
    """The StatefulSet and headless Service of one instance, or its LeaderWorkerSet.

    ``boot_placement`` (eplb mode static): the placement version pods boot with. A new version
    changes the template hash, so instances roll one at a time onto it (0: no annotation).
    """
    name = L.instance_name(owner.name, pool, site.index)
    selector = L.instance_selector(owner.name, pool, site.index)
    labels = {**L.base_labels(owner.name, pool), **selector, K.DEPLOYMENT_UID: owner.uid}
    pod_spec = pod_template(spec, owner, pool, site, settings, compute_domain)
    # Engine config changes reach pods through a new template hash (a rolling group restart).
    hashed: dict[str, Any] = {"pod": pod_spec, "engine": engine_config_hash}
    template_annotations: dict[str, str] = {}
    if boot_placement:
        hashed["bootPlacement"] = boot_placement
        template_annotations[K.BOOT_PLACEMENT] = str(boot_placement)
    template_hash = L.content_hash(hashed)
    nnodes = pool_layout(pools(spec)[pool], spec.topology).nodes
    metadata = {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels,
        "annotations": {
            K.INSTANCE_NODES: json.dumps(
                {
                    "kind": site.kind,
                    "label": site.label,
                    "domain": site.domain,
                    "nodes": list(site.nodes),
                },
                sort_keys=True,
            ),
            K.TEMPLATE_HASH: template_hash,
        },
        "ownerReferences": [owner.reference()],
    }
    template = {
        "metadata": {
            "labels": labels,
            "annotations": {K.TEMPLATE_HASH: template_hash, **template_annotations},
        },
        "spec": pod_spec,
    }
    if backend == "LeaderWorkerSet":
        return [leader_worker_set(metadata, template, nnodes)]
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": nnodes,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            # The operator rolls groups itself: all ranks of an instance restart together.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "clusterIP": "None",
            # Ranks resolve the leader before anyone is Ready.
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": "dist-init", "port": spec.engine.dist_init_port}],
        },
    }
    return [sts, svc]


def leader_worker_set(metadata: dict[str, Any], template: dict[str, Any], nnodes: int) -> dict[str, Any]:
    """One instance as a LeaderWorkerSet of one group: rank 0 is the leader pod ``<name>-0``, ranks
    1.. its workers, all reachable through the controller's headless Service ``<name>`` (so the
    leader address is the same as with a StatefulSet).

    restartPolicy None: the operator restarts failed groups itself, with the same backoff and
    status as for StatefulSets. A template change is applied only when the operator lets that
    instance roll (one per pool at a time); the controller then recreates the group.
    """
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {"size": nnodes, "restartPolicy": "None", "workerTemplate": template},
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }
