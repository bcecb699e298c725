"""Per-pool and per-deployment objects: engine ConfigMaps, pool Services, PDBs, router, ServiceAccounts."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any

from moe_contract.auth import DIGESTS_FILE, KEY_FIELD, digests_document
from moe_contract.flags import router_catalog
from moe_contract.pod import SIDECAR_PORT, SIDECAR_PORT_NAME
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.api.derived import Pool, pools
from moe_operator.api.spec import ROUTER_METRICS_PORT, PoolSpec
from moe_operator.recipe import router_policy, router_role_policies, startup_timeout_s
from moe_operator.render import labels as L
from moe_operator.render.engine import engine_config
from moe_operator.render.engine_container import (
    INIT_RESOURCES,
    NON_ROOT_UID,
    RESTRICTED_CONTAINER,
    SECCOMP_RUNTIME_DEFAULT,
    TERMINATION_MARGIN_S,
    low_port_sysctls,
)
from moe_operator.render.group import (
    Owner,
    engine_config_name,
    leader_address,
    service_account_name,
    token_secret_name,
)
from moe_operator.validation.flags import ROUTER_PRESTOP_S
from moe_operator.validation.flags import router_shutdown_grace_s as shutdown_grace_s


def _meta(
    owner: Owner, name: str, component: str, extra_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**L.base_labels(owner.name, component), **(extra_labels or {})},
        "ownerReferences": [owner.reference()],
    }


def engine_config_map(spec: MoEDeploymentSpec, owner: Owner, pool: Pool) -> dict[str, Any]:
    data = json.dumps(engine_config(spec, pool), indent=2, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, engine_config_name(owner.name, pool), pool, {K.POOL: pool}),
        "data": {"engine.json": data},
    }


def pool_service(spec: MoEDeploymentSpec, owner: Owner, pool: Pool) -> dict[str, Any]:
    """The pool's leaders (rank 0 serves HTTP for the whole instance)."""
    ports = [
        {"name": "http", "port": spec.engine.port, "targetPort": spec.engine.port},
        {"name": SIDECAR_PORT_NAME, "port": SIDECAR_PORT, "targetPort": SIDECAR_PORT_NAME},
    ]
    if pool == "prefill":
        bootstrap = spec.kv_transfer.bootstrap_port
        ports.append({"name": "bootstrap", "port": bootstrap, "targetPort": bootstrap})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, f"{owner.name}-{pool}", pool, {K.POOL: pool}),
        "spec": {
            "selector": {**L.pool_selector(owner.name, pool), "apps.kubernetes.io/pod-index": "0"},
            "ports": ports,
        },
    }


def pool_disruption_budget(owner: Owner, pool: Pool) -> dict[str, Any]:
    """At most one engine pod of a pool evicted at a time: one instance restarts, the rest serve."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, f"{owner.name}-{pool}", pool, {K.POOL: pool}),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": L.pool_selector(owner.name, pool)}},
    }


# The router image must hold the sglang-router its flags were checked against (the router catalog's
# version, pinned in docker/versions.env): an init container says so plainly instead of the router
# failing on a flag another version does not know.
_ROUTER_VERSION_CHECK = """\
import importlib.metadata as m, sys
want = sys.argv[1]
try:
    have = m.version("sglang-router")
except m.PackageNotFoundError:
    have = "not installed"
if have != want:
    sys.exit(f"sglang-router {have} in this image, but the operator renders and checks the router's "
             f"flags for sglang-router {want}: set spec.router.image to an image with sglang-router=={want}")
"""


# sglang-router 0.3.2 serves its control plane (/workers: register, remove and list workers;
# /flush_cache; /get_loads) on the port that takes requests, open to every client unless
# control-plane keys are set: whoever reaches the router could register a worker of its own and
# receive other users' prompts. The operator lists the workers on the command line, so nobody needs
# that API: the router starts with an admin key drawn in the pod, which only the router process holds.
ROUTER_LAUNCH = """\
import os, secrets, sys
lock = "moe-operator:locked:admin:" + secrets.token_hex(32)
argv = [sys.executable, "-m", "sglang_router.launch_router", *sys.argv[1:], "--control-plane-api-keys", lock]
os.execv(sys.executable, argv)
"""


def router_shutdown_grace_s(spec: MoEDeploymentSpec) -> int:
    """The router's own shutdown grace for ``spec`` (validation.flags.router_shutdown_grace_s)."""
    return shutdown_grace_s(spec.router.extra_args)


def router_termination_grace_s(spec: MoEDeploymentSpec) -> int:
    """The kubelet's grace must outlast the pre-stop wait and the router's own shutdown grace, or the
    kubelet kills the router with requests in flight (its default 30 s is shorter than the router's 180)."""
    return ROUTER_PRESTOP_S + router_shutdown_grace_s(spec) + TERMINATION_MARGIN_S


def router_listing(listed: int, off: int | None = None) -> str:
    """How the router Deployment's annotation names a pool's list: ``3``, or ``3-1`` for the first
    three without instance 1 (off the list for its width change)."""
    return str(listed) if off is None or off >= listed or listed < 2 else f"{listed}-{off}"


def router_objects(
    spec: MoEDeploymentSpec,
    owner: Owner,
    serving: Mapping[str, int] | None = None,
    off: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """SGLang's router as a Deployment + Service, wired to every instance leader.

    Probes: /liveness (the process serves) and /readiness (503 until a worker is healthy, so the
    Service sends no traffic to a router without workers); /health is only a liveness alias. The
    router waits for its workers as long as an engine group may take to start (spec.engine.startupTimeout).
    Its worker-management API is locked (ROUTER_LAUNCH). ``serving``: how many of a pool's
    instances the router lists (the autoscaler keeps booting and draining ones off the list);
    ``off``: an instance per pool left out of those (a width change drains it before it rolls).
    """
    r = spec.router
    port = spec.engine.port
    image = r.image or spec.engine.image
    version = router_catalog().version

    def listed(pool: Pool) -> int:
        replicas = pools(spec)[pool].replicas
        return min(replicas, (serving or {}).get(pool, replicas))

    def urls(pool: Pool) -> list[str]:
        hole = (off or {}).get(pool) if listed(pool) >= 2 else None  # never an empty list
        return [f"http://{leader_address(owner, pool, i)}:{port}" for i in range(listed(pool)) if i != hole]

    startup = math.ceil(startup_timeout_s(spec))
    lists = {pool: urls(pool) for pool in pools(spec)}
    workers = sum(len(listed) for listed in lists.values())
    policy = router_policy(r.policy, workers)
    args = [
        "--host",
        "0.0.0.0",
        "--port",
        str(r.port),
        "--policy",
        policy,
        "--prometheus-port",
        str(ROUTER_METRICS_PORT),
    ]
    args += ["--worker-startup-timeout-secs", str(startup)]
    # Worker health by SGLang's cheap /ready: the router's default /health makes SGLang 0.5.23
    # generate a token (1-20 s under load), beyond the router's 5 s health-check timeout.
    args += ["--health-check-endpoint", "/ready"]
    if spec.prefill is not None:
        args.append("--pd-disaggregation")
        args += router_role_policies(spec, len(lists["prefill"]), len(lists["decode"]))
        for url in lists["prefill"]:
            args += ["--prefill", url, str(spec.kv_transfer.bootstrap_port)]
        for url in lists["decode"]:
            args += ["--decode", url]
    else:
        args += ["--worker-urls", *lists["decode"]]
    args += list(r.extra_args)
    labels = L.base_labels(owner.name, "router")
    selector = {K.DEPLOYMENT: owner.name, "app.kubernetes.io/component": "router"}
    container: dict[str, Any] = {
        "name": "router",
        "image": image,
        "command": ["python3", "-c", ROUTER_LAUNCH, *args],  # control plane locked (ROUTER_LAUNCH)
        "ports": [
            {"name": "http", "containerPort": r.port},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT},
        ],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": r.port}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/liveness", "port": r.port},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # each worker-list change replaces the router pods: a pod being replaced waits until the
        # Service stops sending to it, then finishes what it runs (SIGTERM: sglang-router's graceful
        # shutdown); python3 is in every router image (the command above needs it)
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["python3", "-c", f"import time; time.sleep({ROUTER_PRESTOP_S})"]}
            }
        },
    }
    if r.resources:
        container["resources"] = r.resources
    version_check = {
        "name": "router-version",
        "image": image,
        "command": ["python3", "-c", _ROUTER_VERSION_CHECK, version],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "initContainers": [version_check],
        "containers": [container],
        "terminationGracePeriodSeconds": router_termination_grace_s(spec),
    }
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, f"{owner.name}-router", "router"),
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, f"{owner.name}-router", "router"),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": r.port, "targetPort": r.port}]},
    }
    if serving:  # the autoscaler waits until the router runs this list before removing a drained instance
        listing = ",".join(
            f"{pool}={router_listing(listed(pool), (off or {}).get(pool))}" for pool in pools(spec)
        )
        deployment["metadata"].setdefault("annotations", {})[K.ROUTER_WORKERS] = listing
    harden_router_pod(deployment["spec"]["template"]["spec"], owner, r.replicas, selector)
    extra = [router_disruption_budget(owner, selector)] if r.replicas >= 2 else []
    return [router_service_account(owner), deployment, service, *extra]


def router_service_account_name(name: str) -> str:
    return f"{name}-router"


def router_service_account(owner: Owner) -> dict[str, Any]:
    """The router's own identity, bound to nothing and without a token: it never calls the API."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(owner, router_service_account_name(owner.name), "router"),
        "automountServiceAccountToken": False,
    }


# Used when spec.router.resources is unset: a request keeps the router out of BestEffort, the memory
# limit bounds one replica. No CPU limit: CFS throttling adds latency to every proxied request.
ROUTER_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "256Mi"},
    "limits": {"memory": "2Gi", "ephemeral-storage": "2Gi"},
}


def harden_router_pod(
    pod_spec: dict[str, Any], owner: Owner, replicas: int, selector: dict[str, str]
) -> None:
    """Pod Security "restricted" for the router pod: non-root with a fixed UID, read-only root file
    system (a /tmp emptyDir), every capability dropped, seccomp RuntimeDefault, a token-less
    ServiceAccount; default resources; replicas spread over nodes."""
    pod_spec["serviceAccountName"] = router_service_account_name(owner.name)
    pod_spec["automountServiceAccountToken"] = False
    containers = pod_spec["containers"]
    ports = [int(p["containerPort"]) for c in containers for p in c.get("ports", [])]
    sysctls = low_port_sysctls(ports, host_network=False)
    pod_spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        **SECCOMP_RUNTIME_DEFAULT,
        **({"sysctls": sysctls} if sysctls else {}),
    }
    for init in pod_spec.get("initContainers", []):
        init["securityContext"] = copy.deepcopy(RESTRICTED_CONTAINER)
        init.setdefault("resources", copy.deepcopy(INIT_RESOURCES))
    for container in containers:
        container["securityContext"] = copy.deepcopy(RESTRICTED_CONTAINER)
        container.setdefault("resources", copy.deepcopy(ROUTER_RESOURCES))
        container.setdefault("volumeMounts", []).append({"name": "tmp", "mountPath": "/tmp"})
    pod_spec.setdefault("volumes", []).append({"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}})
    if replicas >= 2:
        pod_spec["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": dict(selector)},
                        },
                    }
                ]
            }
        }


def router_disruption_budget(owner: Owner, selector: dict[str, str]) -> dict[str, Any]:
    """Two or more routers: a drain or eviction takes one at a time, the others keep serving. None
    for a single router: a budget that allows no eviction would block node drains."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, f"{owner.name}-router", "router"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(selector)}},
    }


def runtime_rbac(spec: MoEDeploymentSpec, owner: Owner) -> list[dict[str, Any]]:
    """The engine pods' identity: a ServiceAccount bound to no Role and without a token. The runtime
    never calls the Kubernetes API (it reads its placement from the mounted ConfigMap), so it is
    given no permission at all, and the operator needs no right to write RBAC objects."""
    del spec  # one identity per deployment, whatever its pools
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(owner, service_account_name(owner.name), "runtime"),
            "automountServiceAccountToken": False,
        }
    ]


KEY_PLACEHOLDER = "generated-by-the-operator-at-the-first-reconcile"


def instance_names(name: str) -> list[str]:
    """Every instance name a deployment can have, within the spec's bound on replicas."""
    most = max(m.le for m in PoolSpec.model_fields["replicas"].metadata if hasattr(m, "le"))
    return [L.instance_name(name, pool, i) for pool in ("prefill", "decode") for i in range(int(most))]


def token_secret(owner: Owner, key: bytes | None) -> dict[str, Any]:
    """The runtime key (the operator derives each instance's token from it) and the digests that
    engine pods mount (moe_contract.auth); created once, never rendered again. None: a preview."""
    data = (
        {KEY_FIELD: key.hex(), DIGESTS_FILE: digests_document(key, instance_names(owner.name))}
        if key is not None
        else {KEY_FIELD: KEY_PLACEHOLDER, DIGESTS_FILE: '{"digests":{}}'}
    )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(owner, token_secret_name(owner.name), "runtime"),
        "type": "Opaque",
        "stringData": data,
    }
