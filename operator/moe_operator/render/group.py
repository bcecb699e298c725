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
from moe_operator.recipe import effective_env, startup_timeout_s
from moe_operator.recipe.derive import KERNEL_CACHE_DIR, KERNEL_CACHE_NODE_ENV
from moe_operator.render import labels as L
from moe_operator.render.compute_domain import pod_claims
from moe_operator.render.engine import DRAIN_SECONDS, grace_seconds
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


# ---- pod security (docs/security.md, "Engine pods") ------------------------------------------------

NON_ROOT_UID = 10001
"""UID/GID of every container the operator renders that needs no root: the runtime init container,
the router and its version check (the operator image's user too)."""

RESTRICTED_CONTAINER: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": NON_ROOT_UID,
    "runAsGroup": NON_ROOT_UID,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
"""Pod Security "restricted" for a container that only reads its image and writes emptyDirs."""

SECCOMP_RUNTIME_DEFAULT: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}

# Small fixed resources of the short-lived init containers (a copy, a version check): never BestEffort.
INIT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "64Mi"},
    "limits": {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "1Gi"},
}

ENGINE_MEMORY_PER_GPU_GI = 16
"""Default engine memory request per GPU of the node (GiB) when spec.engine.resources sets none: one
SGLang TP/EP rank per GPU holds torch, a CUDA context, pinned host buffers and CUDA-graph state,
plus the tokenizer and detokenizer processes. A request only (no limit): it keeps engine pods out
of the BestEffort class, the first evicted under node memory pressure, where one evicted rank
restarts its whole group."""

ENGINE_EPHEMERAL_STORAGE = "20Gi"
"""Default engine ephemeral-storage request: SGLang, Triton, FlashInfer and DeepGEMM write JIT kernel
caches and logs into the container's file system. A request only: a limit would evict one rank, and
so restart its whole group, when a cache grows."""

ENGINE_CPU_PER_GPU = 1
"""Default engine CPU request per GPU (cores): each rank's scheduler process busy-waits on its GPU."""


def engine_needs_ipc_lock(spec: MoEDeploymentSpec) -> bool:
    """IPC_LOCK, the only capability an engine may get: RDMA NICs pin (register) the memory they
    read and write, beyond RLIMIT_MEMLOCK. Needed where the pod does RDMA: it is given RDMA
    devices (spec.topology.rdmaResourceName: DeepEP/NVSHMEM and NCCL over InfiniBand or RoCE), or
    it sends KV over RDMA in P/D (Mooncake, RDMA unless MC_FORCE_TCP, or named IB devices). NVLink
    (one node, or a multi-node NVLink domain such as GB200 NVL72) needs no capability."""
    if spec.topology.rdma_resource_name:
        return True
    kv = spec.kv_transfer
    return spec.prefill is not None and (kv.backend == "mooncake" or bool(kv.ib_devices))


def engine_security_context(spec: MoEDeploymentSpec) -> dict[str, Any]:
    """Every capability dropped (no NET_RAW, no SYS_RESOURCE: SGLang raises only soft limits), IPC_LOCK
    added back only for RDMA, no privilege escalation. The engine runs as the image's user (root in
    the SGLang images) with a writable root file system: JIT kernel caches are written at run time."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if engine_needs_ipc_lock(spec):
        capabilities["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": capabilities}


def _default_request(resources: dict[str, Any], name: str, value: str) -> None:
    """Request ``value`` of ``name`` unless the spec requests or limits it (a limit alone is also the
    request in Kubernetes)."""
    if name in (resources.get("requests") or {}) or name in (resources.get("limits") or {}):
        return
    resources.setdefault("requests", {})[name] = value


def engine_resources(spec: MoEDeploymentSpec) -> dict[str, Any]:
    """spec.engine.resources plus the GPUs (and RDMA device) of the node, with default CPU and memory
    requests where the spec sets none: never BestEffort."""
    topo = spec.topology
    gpus = str(topo.gpus_per_node)
    resources = copy.deepcopy(spec.engine.resources or {})
    _default_request(resources, "cpu", str(ENGINE_CPU_PER_GPU * topo.gpus_per_node))
    _default_request(resources, "memory", f"{ENGINE_MEMORY_PER_GPU_GI * topo.gpus_per_node}Gi")
    _default_request(resources, "ephemeral-storage", ENGINE_EPHEMERAL_STORAGE)
    limits = resources.setdefault("limits", {})
    requests = resources.setdefault("requests", {})
    limits[topo.gpu_resource_name] = requests[topo.gpu_resource_name] = gpus
    if topo.rdma_resource_name:
        limits[topo.rdma_resource_name] = requests[topo.rdma_resource_name] = "1"
    return resources


def low_port_sysctls(ports: list[int], host_network: bool) -> list[dict[str, str]]:
    """Containers without CAP_NET_BIND_SERVICE bind a port below 1024 only where the pod's network
    namespace allows it (a "safe" sysctl, Pod Security baseline); not settable on the host's."""
    low = min(ports)
    if low >= 1024 or host_network:
        return []
    return [{"name": "net.ipv4.ip_unprivileged_port_start", "value": str(low)}]


def engine_ports(spec: MoEDeploymentSpec, pool: Pool) -> list[dict[str, Any]]:
    """The engine container's named ports: SGLang's HTTP and dist-init ports, the runtime's three
    listeners (API, probes, metrics: moe_contract.pod), the prefill pool's KV bootstrap port."""
    ports: list[dict[str, Any]] = [
        {"name": "http", "containerPort": spec.engine.port},
        {"name": "dist-init", "containerPort": spec.engine.dist_init_port},
        {"name": P.SIDECAR_PORT_NAME, "containerPort": P.SIDECAR_PORT},
        {"name": P.PROBE_PORT_NAME, "containerPort": P.PROBE_PORT},
        {"name": P.METRICS_PORT_NAME, "containerPort": P.METRICS_PORT},
    ]
    if pool == "prefill":
        ports.append({"name": "bootstrap", "containerPort": spec.kv_transfer.bootstrap_port})
    return ports


PROBE_PERIOD_S = 10
"""Start-up and liveness probes: one every 10 s."""
PROBE_TIMEOUT_S = 5
"""A probe unanswered after 5 s fails. The probe listener answers in well under a second even with
500 slow peers on the API port (tests/security/test_runtime_listener.py), and never waits on the
engine (readiness is the last result of a background check), so 5 s means a stuck runtime."""
LIVENESS_FAILURES = 6
"""Six failed liveness probes in a row (a minute) restart the container, and so its whole group."""
READINESS_PERIOD_S = 5
READINESS_FAILURES = 2
"""Two failed readiness probes (about 10 s) take the pod out of its Services."""


def engine_probes(spec: MoEDeploymentSpec) -> dict[str, Any]:
    """Kubelet probes on the runtime's probe listener (port ``probes``, never the API port): start-up
    and liveness on /healthz (the runtime's event loop runs), readiness on /readyz (this rank's
    engine answers). Every probe states its period, timeout and failure threshold: the kubelet's
    default timeout is 1 s. The start-up probe allows spec.engine.startupTimeout."""
    startup_periods = max(int(startup_timeout_s(spec) // PROBE_PERIOD_S), 1)

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": P.PROBE_PORT_NAME},
            "periodSeconds": period,
            "timeoutSeconds": PROBE_TIMEOUT_S,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": probe(P.LIVENESS_PATH, PROBE_PERIOD_S, startup_periods),
        "readinessProbe": probe(P.READINESS_PATH, READINESS_PERIOD_S, READINESS_FAILURES),
        "livenessProbe": probe(P.LIVENESS_PATH, PROBE_PERIOD_S, LIVENESS_FAILURES),
    }


TERMINATION_MARGIN_S = 30
"""Beyond the launcher's own drain and SIGTERM-to-SIGKILL: the runtime's sidecar and log flush."""


def termination_grace_seconds(spec: MoEDeploymentSpec) -> int:
    """The kubelet's grace must outlast the launcher's (drain + grace), or the kubelet kills the engine
    first and SGLang's drain is cut short."""
    return int(DRAIN_SECONDS + grace_seconds(spec) + TERMINATION_MARGIN_S)


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
