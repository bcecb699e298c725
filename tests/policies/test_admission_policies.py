"""The ValidatingAdmissionPolicies in policies/admission, applied to the real sandbox apiserver.

The policies and parameter ConfigMaps are applied as shipped; only the bindings get a
namespaceSelector so the policies touch nothing but this module's namespaces (other tests in
the session create operator pods too). Allowed objects are created with dryRun=All, which
runs admission but stores nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Sandbox, server_side_apply
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
