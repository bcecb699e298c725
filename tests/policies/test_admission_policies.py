"""The ValidatingAdmissionPolicies in policies/admission, applied to the real sandbox apiserver.

The policies and parameter ConfigMaps are applied as shipped; only the bindings get a
namespaceSelector so the policies touch nothing but this module's namespaces (other tests in
the session create operator pods too). Allowed objects are created with dryRun=All, which
runs admission but stores nothing.
"""

from __future__ import annotations

import copy
import re
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Sandbox, server_side_apply
from moe_sandbox.pki import issue_client_cert
from moe_sandbox.testing import wait_for
from operator_harness import install_crd

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
ADMISSION = ROOT / "policies" / "admission"
ADMISSIONREG = "/apis/admissionregistration.k8s.io/v1"
MOED = "/apis/moe.inference.dev/v1alpha1"
TEST_LABEL = "moe.inference.dev/policy-test"
MANAGED = {"app.kubernetes.io/managed-by": "moe-operator"}
POLICY_FILES = ["allowed-registries.yaml", "engine-gpus.yaml", "host-network-rdma.yaml"]


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ADMISSION / name).read_text()) if d]


def path_of(obj: dict[str, Any]) -> str:
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "ConfigMap":
        return f"/api/v1/namespaces/{obj['metadata']['namespace']}/configmaps/{name}"
    if kind == "ValidatingAdmissionPolicy":
        return f"{ADMISSIONREG}/validatingadmissionpolicies/{name}"
    if kind == "ValidatingAdmissionPolicyBinding":
        return f"{ADMISSIONREG}/validatingadmissionpolicybindings/{name}"
    raise AssertionError(f"unexpected kind {kind}")


def apply(api: httpx.Client, obj: dict[str, Any]) -> None:
    server_side_apply(api, path_of(obj), obj, "moe-policy-tests")


def scoped(binding: dict[str, Any]) -> dict[str, Any]:
    binding = copy.deepcopy(binding)
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {TEST_LABEL: "true"}}}
    return binding


@pytest.fixture(scope="module")
def policies(sandbox: Sandbox) -> Iterator[list[dict[str, Any]]]:
    install_crd(sandbox)
    applied: list[dict[str, Any]] = []
    with sandbox.client(timeout=30) as api:
        if api.get("/api/v1/namespaces/moe-system").status_code == 404:
            api.post("/api/v1/namespaces", json={"metadata": {"name": "moe-system"}}).raise_for_status()
        for obj in docs("params.yaml"):
            apply(api, obj)
            applied.append(obj)
        for name in POLICY_FILES:
            for obj in docs(name):
                obj = scoped(obj) if obj["kind"] == "ValidatingAdmissionPolicyBinding" else obj
                apply(api, obj)
                applied.append(obj)
        try:
            yield applied
        finally:
            for obj in reversed(applied):
                api.delete(path_of(obj))


@pytest.fixture()
def ns(policies: list[dict[str, Any]], api: httpx.Client, namespace: str) -> str:
    resp = api.patch(
        f"/api/v1/namespaces/{namespace}",
        json={"metadata": {"labels": {TEST_LABEL: "true"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    return namespace


def moedeployment(image: str, router_image: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    obj["spec"]["engine"] = {"image": image}
    if router_image:
        obj["spec"]["router"]["image"] = router_image
    return obj


def pod(
    name: str,
    gpus: list[int],
    host_network: bool = False,
    rdma: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    containers = []
    for i, count in enumerate(gpus or [0]):
        limits = {"nvidia.com/gpu": str(count)} if count else {}
        if rdma and i == 0:
            limits["rdma/hca_shared_devices_a"] = "1"
        containers.append(
            {"name": f"c{i}", "image": "lmsysorg/sglang:v0.5.23", "resources": {"limits": limits}}
        )
    spec: dict[str, Any] = {"containers": containers}
    if host_network:
        spec["hostNetwork"] = True
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": MANAGED if labels is None else labels},
        "spec": spec,
    }


def create(api: httpx.Client, ns: str, obj: dict[str, Any]) -> httpx.Response:
    path = (
        f"{MOED}/namespaces/{ns}/moedeployments"
        if obj["kind"] == "MoEDeployment"
        else f"/api/v1/namespaces/{ns}/pods"
    )
    return api.post(path, params={"dryRun": "All"}, json=obj)


def denied(api: httpx.Client, ns: str, obj: dict[str, Any], policy: str) -> str:
    """Wait until the policy denies obj (policies take effect asynchronously); its message."""

    def attempt() -> str | None:
        resp = create(api, ns, obj)
        if resp.status_code in (403, 422) and f"ValidatingAdmissionPolicy '{policy}'" in resp.text:
            return str(resp.json()["message"])
        assert resp.status_code in (200, 201), resp.text
        return None

    message: str = wait_for(attempt, 30, what=f"{policy} to deny {obj['metadata']['name']}")
    return message


def allowed(api: httpx.Client, ns: str, obj: dict[str, Any]) -> None:
    resp = create(api, ns, obj)
    assert resp.status_code in (200, 201), resp.text


def test_policies_type_check_cleanly(policies: list[dict[str, Any]], api: httpx.Client) -> None:
    for obj in policies:
        if obj["kind"] != "ValidatingAdmissionPolicy":
            continue

        def checked(name: str = obj["metadata"]["name"]) -> dict[str, Any] | None:
            live: dict[str, Any] = api.get(f"{ADMISSIONREG}/validatingadmissionpolicies/{name}").json()
            status = live.get("status", {})
            done = status.get("observedGeneration") == live["metadata"]["generation"]
            return status if done else None

        status = wait_for(checked, 30, what=f"type checking of {obj['metadata']['name']}")
        assert not status.get("typeChecking", {}).get("expressionWarnings"), status


def test_engine_image_registry(api: httpx.Client, ns: str) -> None:
    message = denied(
        api, ns, moedeployment("docker.io/someone/sglang:latest"), "moe-allowed-engine-registries"
    )
    assert (
        "spec.engine.image docker.io/someone/sglang:latest is not from an allowed registry; allowed prefixes: "
        "lmsysorg/sglang:, nvcr.io/nvidia/, registry.example.com/inference/"
    ) in message
    allowed(api, ns, moedeployment("lmsysorg/sglang:v0.5.23"))
    allowed(api, ns, moedeployment("nvcr.io/nvidia/sglang:25.10"))
    # a prefix is a prefix of the whole reference, not a registry host match
    message = denied(api, ns, moedeployment("lmsysorg/sglang-fork:v1"), "moe-allowed-engine-registries")
    assert "spec.engine.image lmsysorg/sglang-fork:v1 is not from an allowed registry" in message


def test_router_image_registry(api: httpx.Client, ns: str) -> None:
    obj = moedeployment("lmsysorg/sglang:v0.5.23", router_image="ghcr.io/evil/router:1")
    message = denied(api, ns, obj, "moe-allowed-engine-registries")
    assert "spec.router.image ghcr.io/evil/router:1 is not from an allowed registry" in message
    allowed(
        api, ns, moedeployment("lmsysorg/sglang:v0.5.23", router_image="registry.example.com/inference/r:1")
    )


def test_registry_parameter_is_a_knob(api: httpx.Client, ns: str, policies: list[dict[str, Any]]) -> None:
    params = next(o for o in policies if o["metadata"]["name"] == "moe-allowed-registries")
    obj = moedeployment("docker.io/someone/sglang:latest")
    denied(api, ns, obj, "moe-allowed-engine-registries")
    widened = copy.deepcopy(params)
    widened["data"]["registries"] += ",docker.io/someone/"
    apply(api, widened)
    try:
        wait_for(
            lambda: create(api, ns, obj).status_code == 201, 30, what="widened registries to allow the image"
        )
    finally:
        apply(api, params)
    denied(api, ns, obj, "moe-allowed-engine-registries")


def test_engine_pods_take_whole_nodes(api: httpx.Client, ns: str) -> None:
    message = denied(api, ns, pod("three", [3]), "moe-engine-gpus-whole-node")
    assert (
        "engine pods take whole nodes: the pod asks for 3 nvidia.com/gpu, allowed GPU node sizes: 4, 8"
        in message
    )
    # the count is per pod: two containers of 4 on an 8-GPU node pass, 4 + 2 does not
    allowed(api, ns, pod("eight", [8]))
    allowed(api, ns, pod("four", [4]))
    allowed(api, ns, pod("split", [4, 4]))
    message = denied(api, ns, pod("six", [4, 2]), "moe-engine-gpus-whole-node")
    assert "the pod asks for 6 nvidia.com/gpu" in message
    # pods without GPUs (the router) and pods the operator does not manage are not checked
    allowed(api, ns, pod("router", []))
    allowed(api, ns, pod("other", [3], labels={"app": "other"}))


def test_host_network_requires_rdma(api: httpx.Client, ns: str) -> None:
    message = denied(api, ns, pod("hostnet", [8], host_network=True), "moe-host-network-requires-rdma")
    assert "hostNetwork is allowed only for pods that request an RDMA device (an rdma/* resource)" in message
    allowed(api, ns, pod("hostnet-rdma", [8], host_network=True, rdma=True))
    allowed(api, ns, pod("podnet", [8]))
    allowed(api, ns, pod("other-hostnet", [], host_network=True, labels={"app": "other"}))


# ---- moe-operator-pods: what pods of the operator may hold (operator-pods.yaml) -------------------
# Applied with its own parameters and binding (scoped to a namespace of this module), so the other
# policies' pods above are not judged by it. tests/security/test_hostile_specs.py applies it to the
# pods the operator renders from hostile specs and from every example.

PLATFORM_LABEL = "moe.inference.dev/platform-policy-test"
OPERATOR_SA = "system:serviceaccount:moe-system:moe-operator"


@pytest.fixture(scope="module")
def platform_ns(sandbox: Sandbox) -> Iterator[str]:
    """A namespace bound to moe-operator-pods, with secrets hf-token*, configmaps nccl-*, /raid/models
    and hostNetwork granted there."""
    policy, binding = docs("operator-pods.yaml")
    name = f"platform-{uuid.uuid4().hex[:6]}"
    params = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "moe-platform-policy-tests", "namespace": "moe-system"},
        "data": {
            "modelVolumeSources": "persistentVolumeClaim",
            "hostPathPrefixes": "/raid/models",
            "hostNetworkNamespaces": name,
            "tolerationKeys": "nvidia.com/gpu",
            "envSecretNames": "hf-token*",
            "envConfigMapNames": "nccl-*",
            "capabilities": "IPC_LOCK",
        },
    }
    binding["metadata"]["name"] = "moe-operator-pods-policy-tests"
    binding["spec"]["paramRef"]["name"] = params["metadata"]["name"]
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {PLATFORM_LABEL: "true"}}}
    objects = [params, policy, binding]
    with sandbox.client(timeout=30) as api:
        if api.get("/api/v1/namespaces/moe-system").status_code == 404:
            api.post("/api/v1/namespaces", json={"metadata": {"name": "moe-system"}}).raise_for_status()
        for obj in objects:
            apply(api, obj)
        api.post(
            "/api/v1/namespaces", json={"metadata": {"name": name, "labels": {PLATFORM_LABEL: "true"}}}
        ).raise_for_status()
        wait_for(lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200, 30)
        try:
            yield name
        finally:
            api.delete(f"/api/v1/namespaces/{name}")
            for obj in reversed(objects):
                api.delete(path_of(obj))


def engine_pod(name: str = "engine-0", **spec: Any) -> dict[str, Any]:
    """An engine-like pod: what the operator renders, hardened (drop ALL, IPC_LOCK), labelled."""
    container: dict[str, Any] = {
        "name": "engine",
        "image": "lmsysorg/sglang:v0.5.23",
        "env": [{"name": "MOE_RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        },
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    extra = spec.pop("volumes", [])
    pod_spec.update(spec)
    pod_spec["volumes"] = [*pod_spec["volumes"], *extra]
    labels = {**MANAGED, "moe.inference.dev/deployment": "qwen"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": pod_spec}


def with_container(pod: dict[str, Any], **fields: Any) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0].update(fields)
    return pod


def platform_refusal(client: httpx.Client, ns: str, obj: dict[str, Any]) -> str | None:
    kind = obj["kind"]
    path = f"/api/v1/namespaces/{ns}/pods" if kind == "Pod" else f"/apis/apps/v1/namespaces/{ns}/statefulsets"
    resp = client.post(path, params={"dryRun": "All"}, json=obj)
    if resp.status_code in (200, 201):
        return None
    assert resp.status_code in (403, 422) and "ValidatingAdmissionPolicy 'moe-operator-pods'" in resp.text, (
        resp.text
    )
    return str(resp.json()["message"])


def user_client(box: Sandbox, user: str) -> httpx.Client:
    crt, key = issue_client_cert(box.pki, "user-" + re.sub(r"[^a-z0-9-]", "-", user), user)
    ctx = ssl.create_default_context(cafile=str(box.pki.ca_cert))
    ctx.load_cert_chain(str(crt), str(key))
    return httpx.Client(base_url=box.server, verify=ctx, timeout=30)


def test_platform_policy_admits_what_the_operator_renders(api: httpx.Client, platform_ns: str) -> None:
    ns = platform_ns
    pod = engine_pod()
    wait_for(lambda: platform_refusal(api, ns, with_container(pod, securityContext={"privileged": True})), 30,
             what="moe-operator-pods to act")  # fmt: skip
    assert platform_refusal(api, ns, pod) is None
    # what the apiserver's own admission adds: the ServiceAccount token volume, not-ready tolerations
    token = {
        "name": "kube-api-access-x",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }  # fmt: skip
    not_ready = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300}  # fmt: skip
    granted = engine_pod(
        volumes=[
            token,
            {"name": "model", "hostPath": {"path": "/raid/models/dsv3", "type": "Directory"}},
            {"name": "weights", "persistentVolumeClaim": {"claimName": "models"}},
            {"name": "engine-config", "configMap": {"name": "qwen-decode-engine"}},
            {
                "name": "runtime-token",
                "secret": {
                    "secretName": "qwen-runtime-token",
                    "items": [{"key": "digests.json", "path": "digests.json"}],
                },
            },
        ],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, not_ready],
        hostNetwork=True,
    )
    granted = with_container(
        granted,
        volumeMounts=[
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model", "mountPath": "/models", "readOnly": True},
        ],
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token-team-a", "key": "t"}}}],
        envFrom=[{"configMapRef": {"name": "nccl-tuning"}}],
        ports=[{"containerPort": 30000, "hostPort": 30000}],
    )
    assert platform_refusal(api, ns, granted) is None
    # The runtime Secret whole (its key derives every instance's token) or another of its fields: refused.
    for secret in ({"secretName": "qwen-runtime-token"},
                   {"secretName": "qwen-runtime-token", "items": [{"key": "key", "path": "digests.json"}]}):  # fmt: skip
        leaky = engine_pod(volumes=[{"name": "runtime-token", "secret": secret}])
        assert platform_refusal(api, ns, leaky), f"the runtime key reached a pod: {secret}"


@pytest.mark.parametrize(
    ("name", "change", "text"),
    [
        ("privileged", {"securityContext": {"privileged": True}}, "engine (privileged)"),
        ("sys-admin", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "adds SYS_ADMIN"),
        ("net-raw", {"securityContext": {"capabilities": {"add": ["IPC_LOCK", "NET_RAW"]}}}, "adds IPC_LOCK, NET_RAW"),
        ("seccomp-unconfined", {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "unconfined"),
        ("writable-host-path", {"volumeMounts": [{"name": "model", "mountPath": "/m"}]},
         "engine mount one writable"),
        ("secret-env-from", {"envFrom": [{"secretRef": {"name": "db"}}]}, "engine: Secret db"),
        ("duplicate-env", {"env": [{"name": "PYTHONPATH", "value": "/a"}, {"name": "PYTHONPATH", "value": "/b"}]},
         "engine: PYTHONPATH, engine: PYTHONPATH"),
        ("lws-env-on-a-plain-pod", {"env": [{"name": "LWS_GROUP_SIZE", "value": "1"}]}, "engine: LWS_GROUP_SIZE"),
    ],
)  # fmt: skip
def test_platform_policy_refuses_container_escapes(
    api: httpx.Client, platform_ns: str, name: str, change: dict[str, Any], text: str
) -> None:
    pod = engine_pod(volumes=[{"name": "model", "hostPath": {"path": "/raid/models/x"}}])
    target, ns = with_container(pod, **change), platform_ns
    message = wait_for(lambda: platform_refusal(api, ns, target), 30, what=f"{name} refused")
    assert text in message, message


@pytest.mark.parametrize(
    ("name", "spec", "text"),
    [
        ("host-pid", {"hostPID": True}, "hostPID"),
        ("host-ipc", {"hostIPC": True}, "hostIPC"),
        ("pod-seccomp-unconfined", {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "pod (unconfined)"),
        ("tolerate-all", {"tolerations": [{"operator": "Exists"}]}, "every taint (no key) Exists"),
        ("ephemeral-volume", {"volumes": [{"name": "m", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}]},
         "m (a source the platform does not allow)"),
        ("foreign-configmap", {"volumes": [{"name": "c", "configMap": {"name": "other-app"}}]}, "ConfigMap other-app"),
        ("audience-token", {"volumes": [{"name": "t", "projected": {"sources": [
            {"serviceAccountToken": {"path": "t", "audience": "sts.amazonaws.com"}}]}}]}, "t (projected)"),
    ],
)  # fmt: skip
def test_platform_policy_refuses_pod_escapes(
    api: httpx.Client, platform_ns: str, name: str, spec: dict[str, Any], text: str
) -> None:
    message = wait_for(
        lambda: platform_refusal(api, platform_ns, engine_pod(**spec)), 30, what=f"{name} refused"
    )
    assert text in message, message


def test_platform_policy_grants_are_per_namespace(
    api: httpx.Client, platform_ns: str, namespace: str
) -> None:
    """hostNetwork (and its hostPorts) only where the parameters name the namespace."""
    resp = api.patch(
        f"/api/v1/namespaces/{namespace}",
        json={"metadata": {"labels": {PLATFORM_LABEL: "true"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    host = engine_pod(hostNetwork=True)
    message = wait_for(lambda: platform_refusal(api, namespace, host), 30, what="hostNetwork refused")
    assert f"in namespace {namespace}: hostNetwork" in message and f"allowed in: {platform_ns}" in message
    port = with_container(engine_pod(), ports=[{"containerPort": 80, "hostPort": 80}])
    assert "hostPort in engine" in str(platform_refusal(api, namespace, port))
    assert platform_refusal(api, platform_ns, host) is None


def test_platform_policy_matches_the_operator_and_its_pods_only(
    sandbox: Sandbox, api: httpx.Client, platform_ns: str
) -> None:
    """Workloads of the operator's ServiceAccount are judged whatever their labels; other users'
    unlabelled objects are not (the policy leaves the rest of the cluster alone)."""
    bad = engine_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    wait_for(lambda: platform_refusal(api, platform_ns, bad), 30, what="hostPath / refused")
    unlabelled = copy.deepcopy(bad)
    unlabelled["metadata"]["labels"] = {"app": "someone-else"}
    assert platform_refusal(api, platform_ns, unlabelled) is None
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "sneaky"},
        "spec": {
            "serviceName": "sneaky",
            "selector": {"matchLabels": {"app": "sneaky"}},
            "template": {"metadata": {"labels": {"app": "sneaky"}}, "spec": unlabelled["spec"]},
        },
    }
    assert platform_refusal(api, platform_ns, sts) is None
    with user_client(sandbox, OPERATOR_SA) as operator:
        message = platform_refusal(operator, platform_ns, sts)
    assert message is not None and "root (hostPath /)" in message
