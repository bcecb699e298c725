"""The sandbox is a real control plane: schemas, watches, scheduling, controllers and GC all work."""

from __future__ import annotations

import ipaddress
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from moe_operator.topology import nodepools
from moe_sandbox.cluster import Ports, Sandbox, _port_open
from moe_sandbox.testing import wait_for

pytestmark = pytest.mark.cluster


def test_version_and_gpu_node_pools(api: httpx.Client) -> None:
    assert api.get("/version").json()["gitVersion"] == "v1.37.2"
    nodes = api.get("/api/v1/nodes").json()["items"]
    gpu = [n for n in nodes if int(n["status"]["allocatable"].get("nvidia.com/gpu", "0")) > 0]
    cliques = [n for n in gpu if nodepools.CLIQUE_LABEL in n["metadata"]["labels"]]
    assert len(gpu) >= 30
    assert len(cliques) >= 18
    h100 = [n for n in gpu if n["metadata"]["labels"]["nvidia.com/gpu.product"].startswith("NVIDIA-H100")]
    assert len(h100) >= 32
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in h100)
    for n in gpu:
        cidr = ipaddress.ip_network(n["spec"]["podCIDR"])
        assert cidr.subnet_of(ipaddress.ip_network("127.0.0.0/8"))
        ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.sandbox.moe.inference.dev"},
    "spec": {
        "group": "sandbox.moe.inference.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            },
                            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_object_watch_and_status_patch(api: httpx.Client, namespace: str) -> None:
    resp = api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=WIDGET_CRD)
    assert resp.status_code in (201, 409), resp.text
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.sandbox.moe.inference.dev"
    wait_for(
        lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (api.get(crd_path).json().get("status") or {}).get("conditions") or []
        ),
        30,
        what="CRD established",
    )
    base = f"/apis/sandbox.moe.inference.dev/v1/namespaces/{namespace}/widgets"
    wait_for(lambda: api.get(base).status_code == 200, 30, what="CRD served")

    # The schema is enforced by the apiserver.
    bad = api.post(base, json={"apiVersion": "sandbox.moe.inference.dev/v1", "kind": "Widget",
                               "metadata": {"name": "bad"}, "spec": {"size": 0}})  # fmt: skip
    assert bad.status_code == 422 and "spec.size" in bad.text

    rv = api.get(base).json()["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        with api.stream(
            "GET", base, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "20"}
        ) as r:
            for line in r.iter_lines():
                if line:
                    events.append(json.loads(line))
                if len(events) >= 2:
                    break
        done.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    obj = {"apiVersion": "sandbox.moe.inference.dev/v1", "kind": "Widget",
           "metadata": {"name": "w1"}, "spec": {"size": 3}}  # fmt: skip
    assert api.post(base, json=obj).status_code == 201
    patched = api.patch(
        f"{base}/w1/status",
        json={"status": {"phase": "Shiny"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200 and patched.json()["status"]["phase"] == "Shiny"
    assert done.wait(20)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    assert events[1]["object"]["status"]["phase"] == "Shiny"


def _gpu_pod(name: str, gpus: int, label: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "engine", "image": "lmsysorg/sglang:v0.5.23",
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": label, "operator": "In", "values": [value]}]}]}}},
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("gpus", "label", "value"),
    [
        (8, "topology.kubernetes.io/zone", "h100-rack-1"),
        (4, nodepools.CLIQUE_LABEL, "gb200-nvl.1"),
    ],
)
def test_gpu_pod_bound_by_scheduler_to_matching_node(
    api: httpx.Client, namespace: str, gpus: int, label: str, value: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    assert api.post(pods, json=_gpu_pod("engine", gpus, label, value)).status_code == 201

    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = api.get(f"{pods}/engine").json()
        return pod if pod.get("status", {}).get("phase") == "Running" and pod["status"].get("podIP") else None

    pod = wait_for(running, 60, what="pod Running with an IP")
    node = api.get(f"/api/v1/nodes/{pod['spec']['nodeName']}").json()
    assert node["metadata"]["labels"][label] == value
    assert ipaddress.ip_address(pod["status"]["podIP"]).is_loopback


def test_pod_that_cannot_fit_stays_pending(api: httpx.Client, namespace: str) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # GB200 nodes have 4 GPUs: 8 cannot fit in that clique.
    assert (
        api.post(pods, json=_gpu_pod("toolarge", 8, nodepools.CLIQUE_LABEL, "gb200-nvl.0")).status_code == 201
    )

    def unschedulable() -> bool:
        conds = api.get(f"{pods}/toolarge").json().get("status", {}).get("conditions", [])
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

    wait_for(unschedulable, 30, what="PodScheduled=False/Unschedulable")


def test_statefulset_pods_and_garbage_collection(api: httpx.Client, namespace: str) -> None:
    apps = f"/apis/apps/v1/namespaces/{namespace}/statefulsets"
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "group"},
        "spec": {
            "replicas": 2,
            "podManagementPolicy": "Parallel",
            "serviceName": "group",
            "selector": {"matchLabels": {"app": "group"}},
            "template": {
                "metadata": {"labels": {"app": "group"}},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            },
        },
    }  # fmt: skip
    created = api.post(apps, json=sts)
    assert created.status_code == 201, created.text
    uid = created.json()["metadata"]["uid"]
    pods = f"/api/v1/namespaces/{namespace}/pods"

    def two_running() -> bool:
        items = api.get(pods, params={"labelSelector": "app=group"}).json()["items"]
        return len(items) == 2 and all(p["status"].get("phase") == "Running" for p in items)

    wait_for(two_running, 60, what="StatefulSet pods Running")
    items = api.get(pods, params={"labelSelector": "app=group"}).json()["items"]
    assert sorted(p["metadata"]["name"] for p in items) == ["group-0", "group-1"]
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == uid for p in items)

    # A ConfigMap owned by the StatefulSet goes when its owner goes.
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    child = {"metadata": {"name": "child", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "group", "uid": uid}]}, "data": {"k": "v"}}  # fmt: skip
    assert api.post(cms, json=child).status_code == 201
    api.delete(f"{apps}/group", params={"propagationPolicy": "Background"}).raise_for_status()
    wait_for(lambda: api.get(f"{cms}/child").status_code == 404, 60, what="owned ConfigMap collected")
    wait_for(
        lambda: not api.get(pods, params={"labelSelector": "app=group"}).json()["items"],
        60,
        what="StatefulSet pods collected",
    )


def test_down_leaves_no_process_behind(tmp_path: Path) -> None:
    """A second, small sandbox on other ports: up, interrupted state, down -> nothing left."""
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(
        "pools:\n- {name: tiny, count: 2, gpusPerNode: 8, gpuProduct: NVIDIA-H100-80GB-HBM3, gpuMemoryMiB: 81559}\n"
    )
    ports = Ports(18000)
    box = Sandbox(tmp_path / "state", ports)
    try:
        box.up(nodes_file, log=lambda _m: None)
        assert all(box.running().values())
        assert box.up(nodes_file, log=lambda _m: None) < 30  # idempotent and quick when running
        # Lose the pid files (as after a crash): down must still find every process.
        for pidfile in (box.dir / "pids").iterdir():
            pidfile.unlink()
    finally:
        box.down(log=lambda _m: None)
    assert list(box._own_processes()) == []
    assert not any(_port_open(p) for p in ports.all().values())
