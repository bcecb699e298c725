"""Engine and router pod hardening (render/group.py, render/shared.py): capabilities, privilege
escalation, seccomp, ServiceAccount tokens, non-root init and router containers, QoS classes, the
router's disruption budget. Every example is rendered as the reconciler would."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.render.children import render_children
from moe_operator.render.engine_container import (
    ENGINE_EPHEMERAL_STORAGE,
    ENGINE_MEMORY_PER_GPU_GI,
    NON_ROOT_UID,
    engine_needs_ipc_lock,
)
from moe_operator.render.group import Owner, RuntimeSettings, pod_template
from moe_operator.render.shared import router_objects, runtime_rbac
from moe_operator.topology import nodepools
from moe_operator.topology.planner import InstanceSite, plan_topology
from moe_operator.topology.requests import pool_requests, topology_policy
from moe_operator.topology.snapshot import node_from_object
from render_cases import REPO, gb200_decode_spec

OWNER = Owner("m", "inference", "uid-1")
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
# Capabilities the admission policy (policies/admission) admits on operator-created pods.
ALLOWED_CAPABILITIES = {"IPC_LOCK"}


def example_spec(name: str) -> MoEDeploymentSpec:
    return MoEDeploymentSpec.model_validate(yaml.safe_load((REPO / "examples" / name).read_text())["spec"])


@cache
def _nodes() -> tuple[Any, ...]:
    """The sandbox's default node pools, Ready (as `moe-operator plan` reads them)."""
    objects = nodepools.render_nodes(nodepools.load())
    for o in objects:
        o["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return tuple(node_from_object(o) for o in objects)


def children(spec: MoEDeploymentSpec) -> list[dict[str, Any]]:
    plan = plan_topology(pool_requests(spec), list(_nodes()), topology_policy(spec))
    assert not plan.waiting, plan.waiting
    return render_children(spec, OWNER, plan, RuntimeSettings())


def pod_specs(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] == kind]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def qos_class(pod: dict[str, Any]) -> str:
    """Kubernetes' QoS class of a pod (pkg/apis/core/helper/qos: GetPodQOS), over cpu and memory of
    every container, init containers included."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers(pod):
        res = c.get("resources") or {}
        req = {k: v for k, v in (res.get("requests") or {}).items() if k in ("cpu", "memory")}
        lim = {k: v for k, v in (res.get("limits") or {}).items() if k in ("cpu", "memory")}
        for k in req:
            requests[k] = 1
        for k in lim:
            limits[k] = 1
        if set(lim) != {"cpu", "memory"}:
            guaranteed = False
        if any(req.get(k, lim[k]) != lim[k] for k in lim):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# ---- engine pods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES)
def test_engine_pods_drop_every_capability_but_ipc_lock_for_rdma(example: str) -> None:
    spec = example_spec(example)
    pods = pod_specs(children(spec), "StatefulSet")
    assert pods
    for pod in pods:
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostPID") and not pod.get("hostIPC")
        (engine,) = pod["containers"]
        sc = engine["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc.get("privileged") is not True
        assert sc["capabilities"]["drop"] == ["ALL"]
        added = set(sc["capabilities"].get("add", []))
        assert added <= ALLOWED_CAPABILITIES
        assert added == ({"IPC_LOCK"} if engine_needs_ipc_lock(spec) else set())
    # The P/D examples move KV with Mooncake (RDMA unless forced onto TCP) or have RDMA NICs in the
    # pod (h100-ib, h200-roce profiles): IPC_LOCK; the single-node example needs nothing pinned.
    assert engine_needs_ipc_lock(spec) == (example != "qwen3-30b-a3b-single-node.yaml")


def _spec(**changes: Any) -> MoEDeploymentSpec:
    data = example_spec("deepseek-v3-pd-h100.yaml").model_dump(by_alias=True, exclude_none=True)
    data["topology"].pop("rdmaResourceName")
    data["topology"].pop("hardware")  # else its profile fills rdmaResourceName back in
    data["kvTransfer"] = {"backend": "nixl"}
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = {**data.get(key, {}), **value}
    return MoEDeploymentSpec.model_validate(data)


@pytest.mark.parametrize(
    ("changes", "needs"),
    [
        ({}, False),  # P/D over NIXL, no RDMA devices: NVLink or TCP, nothing pinned
        ({"topology": {"rdmaResourceName": "rdma/ib"}}, True),  # RDMA NICs in the pod
        ({"kvTransfer": {"backend": "mooncake"}}, True),  # Mooncake transfers over RDMA by default
        ({"kvTransfer": {"ibDevices": ["mlx5_0"]}}, True),  # KV over named IB devices
        ({"kvTransfer": {"backend": "mooncake"}, "prefill": None}, False),  # no P/D: no KV transfer
    ],
)
def test_ipc_lock_only_where_rdma_pins_memory(changes: dict[str, Any], needs: bool) -> None:
    spec = _spec(**changes)
    assert engine_needs_ipc_lock(spec) is needs
    pool = "prefill" if spec.prefill else "decode"
    site = InstanceSite(pool, 0, "node", "kubernetes.io/hostname", "n0", ("n0",))
    engine = pod_template(spec, OWNER, pool, site, RuntimeSettings())["containers"][0]
    assert engine["securityContext"]["capabilities"].get("add", []) == (["IPC_LOCK"] if needs else [])


@pytest.mark.parametrize("example", EXAMPLES)
def test_no_pod_mounts_a_service_account_token_and_no_rbac_is_rendered(example: str) -> None:
    objects = children(example_spec(example))
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    assert all(sa["automountServiceAccountToken"] is False for sa in accounts.values())
    for kind in ("StatefulSet", "Deployment"):
        for pod in pod_specs(objects, kind):
            assert pod["automountServiceAccountToken"] is False
            assert pod["serviceAccountName"] in accounts, "every pod runs as its own rendered account"
            assert not any(v.get("projected") for v in pod["volumes"]), "no projected token volume"
    engine_sa = {p["serviceAccountName"] for p in pod_specs(objects, "StatefulSet")}
    router_sa = {p["serviceAccountName"] for p in pod_specs(objects, "Deployment")}
    assert engine_sa == {"m-runtime"} and router_sa == {"m-router"}, "engines and routers: one account each"


def test_runtime_identity_is_one_token_less_service_account() -> None:
    (sa,) = runtime_rbac(gb200_decode_spec(), OWNER)
    assert sa["kind"] == "ServiceAccount" and sa["automountServiceAccountToken"] is False


def _restricted(container: dict[str, Any]) -> None:
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == sc["runAsGroup"] == NON_ROOT_UID
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("example", EXAMPLES)
def test_init_containers_and_routers_are_non_root_restricted(example: str) -> None:
    objects = children(example_spec(example))
    for pod in pod_specs(objects, "StatefulSet"):
        (init,) = pod["initContainers"]
        _restricted(init)
        runtime = next(v for v in pod["volumes"] if v["name"] == "runtime")
        assert runtime["emptyDir"]["sizeLimit"], "the copied runtime cannot fill the node's disk"
    (router,) = pod_specs(objects, "Deployment")
    assert router["securityContext"]["runAsNonRoot"] is True
    assert router["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in containers(router):
        _restricted(container)
    # A read-only root: anything the router writes goes to its /tmp emptyDir.
    (main,) = router["containers"]
    tmp = next(m for m in main["volumeMounts"] if m["mountPath"] == "/tmp")
    assert {"name": tmp["name"], "emptyDir": {"sizeLimit": "256Mi"}} in router["volumes"]


# ---- resources: never BestEffort -------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES)
def test_no_rendered_pod_is_best_effort(example: str) -> None:
    objects = children(example_spec(example))
    for kind in ("StatefulSet", "Deployment"):
        for pod in pod_specs(objects, kind):
            assert qos_class(pod) != "BestEffort", (kind, pod["containers"][0]["name"])


def test_engine_defaults_fill_only_what_the_spec_leaves_out() -> None:
    # gb200: GPUs only in the spec -> one CPU and 16Gi per GPU requested, no limits added.
    spec = example_spec("deepseek-v3-gb200.yaml")
    (pod, *_) = pod_specs(children(spec), "StatefulSet")
    res = pod["containers"][0]["resources"]
    assert res["requests"] == {
        "cpu": "4",
        "memory": f"{ENGINE_MEMORY_PER_GPU_GI * 4}Gi",
        "ephemeral-storage": ENGINE_EPHEMERAL_STORAGE,
        "nvidia.com/gpu": "4",
    }
    assert res["limits"] == {"nvidia.com/gpu": "4"}
    # P/D H100: the spec's own cpu/memory stay as they are.
    spec = example_spec("deepseek-v3-pd-h100.yaml")
    (pod, *_) = pod_specs(children(spec), "StatefulSet")
    res = pod["containers"][0]["resources"]
    assert res["requests"]["cpu"] == "64" and res["requests"]["memory"] == "1000Gi"
    assert res["limits"]["memory"] == "1500Gi" and "cpu" not in res["limits"]
    # A limit alone is the request in Kubernetes: no default request beside it.
    data = spec.model_dump(by_alias=True, exclude_none=True)
    data["engine"]["resources"] = {"limits": {"memory": "900Gi", "cpu": "100"}}
    custom = MoEDeploymentSpec.model_validate(data)
    (pod, *_) = pod_specs(children(custom), "StatefulSet")
    res = pod["containers"][0]["resources"]
    assert "memory" not in res["requests"] and "cpu" not in res["requests"]
    assert res["limits"]["memory"] == "900Gi"
    # the spec object itself is never modified by rendering
    assert custom.engine.resources == {"limits": {"memory": "900Gi", "cpu": "100"}}


def test_router_default_resources_and_spec_resources() -> None:
    spec = gb200_decode_spec()
    deployment = next(o for o in router_objects(spec, OWNER) if o["kind"] == "Deployment")
    (router,) = deployment["spec"]["template"]["spec"]["containers"]
    assert router["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "256Mi"}
    spec = spec.model_copy(deep=True)
    spec.router.resources = {"requests": {"cpu": "2", "memory": "4Gi"}}
    deployment = next(o for o in router_objects(spec, OWNER) if o["kind"] == "Deployment")
    (router,) = deployment["spec"]["template"]["spec"]["containers"]
    assert router["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}


# ---- router availability ---------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [0, 1, 2, 5])
def test_router_disruption_budget_and_spread_from_two_replicas(replicas: int) -> None:
    spec = gb200_decode_spec().model_copy(deep=True)
    spec.router.replicas = replicas
    objects = router_objects(spec, OWNER)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    if replicas < 2:
        assert budgets == [], "a budget over one router would block node drains"
        assert "affinity" not in pod["spec"]
        return
    (pdb,) = budgets
    assert pdb["spec"]["maxUnavailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items(), "the budget selects the router pods"
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector


# ---- ports below 1024 without capabilities ---------------------------------------------------------


def test_low_ports_use_the_unprivileged_port_sysctl_not_a_capability() -> None:
    spec = gb200_decode_spec().model_copy(deep=True)
    spec.router.port = 80
    deployment = next(o for o in router_objects(spec, OWNER) if o["kind"] == "Deployment")
    sysctls = deployment["spec"]["template"]["spec"]["securityContext"]["sysctls"]
    assert sysctls == [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "80"}]
    spec.engine.port = 443
    site = InstanceSite("decode", 0, "node", "kubernetes.io/hostname", "n0", ("n0",))
    pod = pod_template(spec, OWNER, "decode", site, RuntimeSettings())
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "443"}
    ]
    # no NET_BIND_SERVICE for the low port (IPC_LOCK only for the RDMA NICs this spec asks for)
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    # the node's network namespace takes no pod sysctl
    spec.topology.host_network = True
    pod = pod_template(spec, OWNER, "decode", site, RuntimeSettings())
    assert "sysctls" not in pod["securityContext"]
    # the usual ports need nothing
    pod = pod_template(gb200_decode_spec(), OWNER, "decode", site, RuntimeSettings())
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
