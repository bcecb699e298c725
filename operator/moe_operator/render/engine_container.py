"""The engine container's parts that do not depend on where the group runs: security context,
resources, ports, probes and termination grace (pure; docs/security.md, "Engine pods")."""

from __future__ import annotations

import copy
from typing import Any

from moe_contract import pod as P
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.derived import Pool
from moe_operator.recipe import startup_timeout_s
from moe_operator.render.engine import DRAIN_SECONDS, grace_seconds

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
