"""The reconciler on the sandbox: examples reach Ready in the planned domains, group semantics, waiting."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, bind_model_volume, moed_path

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def example(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return obj


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), {})


def wait_ready(api: httpx.Client, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj: dict[str, Any] = api.get(moed_path(namespace, name)).json()
        return obj if condition(obj, "Ready").get("status") == "True" else None

    try:
        result: dict[str, Any] = wait_for(ready, timeout, interval=0.5, what=f"{name} Ready")
    except AssertionError:
        obj = api.get(moed_path(namespace, name)).json()
        raise AssertionError(f"{name} not Ready: {json.dumps(obj.get('status'), indent=1)}") from None
    return result


def engine_pods(api: httpx.Client, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(
        f"/api/v1/namespaces/{namespace}/pods",
        params={"labelSelector": f"moe.inference.dev/deployment={name},moe.inference.dev/instance"},
    ).json()["items"]
    return items


def pods_by_instance(pods: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in pods:
        labels = p["metadata"]["labels"]
        out.setdefault((labels["moe.inference.dev/pool"], labels["moe.inference.dev/instance"]), []).append(p)
    return out


def node_labels(api: httpx.Client, node: str) -> dict[str, str]:
    labels: dict[str, str] = api.get(f"/api/v1/nodes/{node}").json()["metadata"]["labels"]
    return labels


@pytest.fixture()
def deployed(api: httpx.Client, namespace: str, moe_operator: OperatorProcess) -> Iterator[str]:
    for claim in ("models", "qwen3-30b-a3b"):
        bind_model_volume(api, namespace, claim)
    yield namespace
    for item in api.get(moed_path(namespace)).json()["items"]:
        api.delete(moed_path(namespace, item["metadata"]["name"]))


@pytest.mark.parametrize(
    ("file", "domain_label"),
    [
        ("deepseek-v3-pd-h100.yaml", "topology.kubernetes.io/zone"),
        ("deepseek-v3-gb200.yaml", "nvidia.com/gpu.clique"),
        ("qwen3-30b-a3b-single-node.yaml", "kubernetes.io/hostname"),
    ],
)
def test_example_reaches_ready_in_one_domain_per_instance(
    api: httpx.Client, deployed: str, file: str, domain_label: str
) -> None:
    obj = example(file)
    name = obj["metadata"]["name"]
    assert api.post(moed_path(deployed), json=obj).status_code == 201
    status = wait_ready(api, deployed, name)["status"]
    spec = obj["spec"]
    pods = engine_pods(api, deployed, name)
    groups = pods_by_instance(pods)
    for pool in ("prefill", "decode"):
        if pool not in spec:
            continue
        assert status["pools"][pool]["readyReplicas"] == spec[pool]["replicas"]
        for i in range(spec[pool]["replicas"]):
            members = groups[(pool, str(i))]
            assert len(members) == spec[pool]["nodesPerReplica"]
            # From the scheduler's bindings and the nodes' labels, not from the plan:
            nodes = {p["spec"]["nodeName"] for p in members}
            assert len(nodes) == len(members), "two ranks of one instance on one node"
            domains = {node_labels(api, n).get(domain_label) for n in nodes}
            assert len(domains) == 1 and None not in domains, f"{pool}-{i} spans {domains}"
            gpus = {p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in members}
            # as the spec is read: written, else its hardware profile's
            assert gpus == {str(MoEDeploymentSpec.model_validate(spec).topology.gpus_per_node)}
    # On H100 both decode instances fit a rack each: they are spread (fault isolation). On GB200 the
    # pods have no RDMA NIC, so every prefill instance sits in the decode instance's clique (the KV
    # cache moves over NVLink only).
    if file == "deepseek-v3-gb200.yaml":
        cliques = {node_labels(api, p["spec"]["nodeName"])[domain_label] for p in pods}
        assert len(cliques) == 1, cliques
    if file == "deepseek-v3-pd-h100.yaml":
        doms = {
            node_labels(api, groups[("decode", str(i))][0]["spec"]["nodeName"])[domain_label]
            for i in range(2)
        }
        assert len(doms) == 2


def _too_big_spec() -> dict[str, Any]:
    obj = example("qwen3-30b-a3b-single-node.yaml")
    obj["metadata"]["name"] = "too-big"
    # 17 H100 nodes in one rack: the sandbox racks have 16.
    obj["spec"]["decode"].update({"nodesPerReplica": 17, "attentionDataParallel": 136})
    obj["spec"]["eplb"] = {"mode": "operator", "redundantExperts": 8}
    obj["spec"]["topology"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    return obj


def test_too_big_waits_then_runs_when_nodes_are_added(
    api: httpx.Client, deployed: str, sandbox: Sandbox
) -> None:
    obj = _too_big_spec()
    resp = api.post(moed_path(deployed), json=obj)
    assert resp.status_code == 201, resp.text

    def waiting() -> dict[str, Any] | None:
        got: dict[str, Any] = api.get(moed_path(deployed, "too-big")).json()
        return got if condition(got, "Ready").get("reason") == "WaitingForCapacity" else None

    got = wait_for(waiting, 60, what="WaitingForCapacity")
    message = condition(got, "Ready")["message"]
    assert "decode instance 0 needs 17 nodes with 8 free GPUs in one NVLink domain or rack" in message, (
        message
    )
    assert condition(got, "Degraded")["status"] == "True"
    # Never half a group: no StatefulSet, no pod.
    assert not engine_pods(api, deployed, "too-big")
    events = api.get(f"/api/v1/namespaces/{deployed}/events").json()["items"]
    assert any(e["reason"] == "WaitingForCapacity" for e in events)

    # Add one H100 node to a rack; the spec is untouched.
    template = api.get("/api/v1/nodes/h100-031").json()
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "h100-extra",
            "labels": {**template["metadata"]["labels"], "kubernetes.io/hostname": "h100-extra"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"podCIDR": "127.31.255.0/24"},
        "status": {
            "capacity": template["status"]["capacity"],
            "allocatable": template["status"]["allocatable"],
        },
    }
    with sandbox.client() as c:
        sandbox.create_node(node, c)
    try:
        wait_ready(api, deployed, "too-big")
        assert len(engine_pods(api, deployed, "too-big")) == 17
    finally:
        api.delete(moed_path(deployed, "too-big"))
        wait_for(lambda: not engine_pods(api, deployed, "too-big"), 180, what="pods gone")
        api.delete("/api/v1/nodes/h100-extra")


def pod_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _uids(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def test_group_semantics_kill_pod_and_lose_node(api: httpx.Client, deployed: str) -> None:
    obj = example("deepseek-v3-gb200.yaml")
    name = obj["metadata"]["name"]
    # Two decode instances of 4 nodes (TP 4 inside a node; EP 16) and no prefill: fast to check.
    obj["spec"].pop("prefill")
    obj["spec"]["topology"]["rdmaResourceName"] = "rdma/ib"  # EP16 normal kernels on GB200 need RDMA
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"]["redundantExperts"] = 16
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    wait_ready(api, deployed, name)
    groups = pods_by_instance(engine_pods(api, deployed, name))
    before_0, before_1 = _uids(groups[("decode", "0")]), _uids(groups[("decode", "1")])

    # Kill one rank of instance 1: every rank of instance 1 restarts, instance 0 is untouched.
    victim = sorted(before_1)[1]
    api.delete(f"/api/v1/namespaces/{deployed}/pods/{victim}")

    def restarted() -> bool:
        now = pods_by_instance(engine_pods(api, deployed, name)).get(("decode", "1"), [])
        uids = _uids(now)
        return len(uids) == 4 and not (set(uids.values()) & set(before_1.values()))

    wait_for(restarted, 90, interval=0.5, what="whole instance 1 restarted")
    wait_ready(api, deployed, name)
    after = pods_by_instance(engine_pods(api, deployed, name))
    assert _uids(after[("decode", "0")]) == before_0
    got = api.get(moed_path(deployed, name)).json()
    assert got["status"]["pools"]["decode"]["groupRestarts"] >= 1
    events = api.get(f"/api/v1/namespaces/{deployed}/events").json()["items"]
    assert any(e["reason"] == "GroupRestarting" and "instance 1" in e["message"] for e in events)

    # Delete a node of instance 0: it moves (other nodes), instance 1 keeps running.
    node = after[("decode", "0")][0]["spec"]["nodeName"]
    saved = api.get(f"/api/v1/nodes/{node}").json()
    before_1 = _uids(after[("decode", "1")])
    api.delete(f"/api/v1/nodes/{node}")
    try:

        def moved() -> bool:
            now = pods_by_instance(engine_pods(api, deployed, name)).get(("decode", "0"), [])
            return len(now) == 4 and all(
                p["spec"].get("nodeName") not in (None, node) and p["status"].get("phase") == "Running"
                for p in now
            )

        wait_for(moved, 120, interval=0.5, what="instance 0 moved off the lost node")
        wait_ready(api, deployed, name)
        assert _uids(pods_by_instance(engine_pods(api, deployed, name))[("decode", "1")]) == before_1
    finally:
        saved["metadata"] = {k: saved["metadata"][k] for k in ("name", "labels", "annotations")}
        api.post("/api/v1/nodes", json=saved)


def test_idle_operator_makes_no_writes_and_restart_converges(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess
) -> None:
    obj = example("qwen3-30b-a3b-single-node.yaml")
    name = obj["metadata"]["name"]
    # A short refresh so the control loop is in its steady state too (no runtime answers here:
    # its first evaluation records that once, later ones change nothing and write nothing).
    obj["spec"]["eplb"].update({"refreshInterval": "10s", "minInterval": "10s", "history": "2m"})
    assert api.post(moed_path(deployed), json=obj).status_code == 201
    wait_ready(api, deployed, name)
    wait_for(
        lambda: ((api.get(moed_path(deployed, name)).json().get("status") or {}).get("placement") or {}).get(
            "decode"
        ),
        60,
        what="first control-loop evaluation",
    )
    # The series the alert rules (policies/prometheus) are written against.
    metrics = httpx.get(f"http://127.0.0.1:{moe_operator.metrics_port}/metrics", timeout=5).text
    labels = f'deployment="{name}",namespace="{deployed}",pool="decode"'
    assert f"moe_operator_pool_ready_instances{{{labels}}} 1.0" in metrics
    assert f"moe_operator_pool_desired_instances{{{labels}}} 1.0" in metrics
    assert (
        f'moe_operator_condition{{deployment="{name}",namespace="{deployed}",reason="AllPoolsReady",type="Ready"}} 1.0'
        in metrics
    )
    # Earlier tests' namespaces are deleted without waiting; while one terminates, the operator is
    # not idle (that deployment's children go away, and its last events are refused with 403).
    wait_for(lambda: not terminating_namespaces(api), 300, interval=2, what="earlier tests' namespaces gone")
    quiet_since(moe_operator, quiet=15, at_most=90)  # the last status and event writes have landed
    # Five minutes with nothing changing (MOE_IDLE_SECONDS shortens it for quick local runs).
    idle = float(os.environ.get("MOE_IDLE_SECONDS", "300"))
    before, start = moe_operator.writes(), time.time()
    time.sleep(idle)
    after, audited = moe_operator.writes(), moe_operator.audited_writes(since=start)
    # Counted by the API server (audit log: kopf's patches and events included), not assumed.
    print(
        f"\noperator writes while idle for {idle:.0f}s: {len(audited)} (audit log), {after - before:.0f} (own client)"
    )
    mine = [e for e in audited if f"/namespaces/{deployed}/" in e["requestURI"]]
    assert not mine, [(e["verb"], e["requestURI"]) for e in mine]
    assert not audited, [(e["verb"], e["requestURI"], e["responseStatus"].get("code")) for e in audited]

    def children() -> list[tuple[str, str]]:
        out = []
        for path in ("/apis/apps/v1/namespaces/{ns}/statefulsets", "/api/v1/namespaces/{ns}/services",
                     "/api/v1/namespaces/{ns}/configmaps", "/apis/apps/v1/namespaces/{ns}/deployments"):  # fmt: skip
            items = api.get(
                path.format(ns=deployed), params={"labelSelector": f"moe.inference.dev/deployment={name}"}
            )
            out += [(path, i["metadata"]["uid"]) for i in items.json()["items"]]
        return sorted(out)

    first = children()
    pods = _uids(engine_pods(api, deployed, name))
    moe_operator.restart(sig=9)  # kill -9: no graceful shutdown
    time.sleep(10)
    wait_ready(api, deployed, name)
    assert children() == first, "restart created or replaced children"
    assert _uids(engine_pods(api, deployed, name)) == pods


def terminating_namespaces(api: httpx.Client) -> list[str]:
    items = api.get("/api/v1/namespaces").json()["items"]
    return [n["metadata"]["name"] for n in items if n["status"].get("phase") == "Terminating"]


def quiet_since(operator: OperatorProcess, quiet: float, at_most: float) -> None:
    """Until the API server has logged no write of the operator for ``quiet`` seconds (a loaded
    machine can take longer than any fixed sleep to land the last status and event writes)."""
    deadline, start = time.monotonic() + at_most, time.time()
    count, since = 0, time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"the operator kept writing for {at_most:.0f}s"
        time.sleep(1)
        now = len(operator.audited_writes(since=start))
        if now != count:
            count, since = now, time.monotonic()


def change_spec_and_watch_roll(
    api: httpx.Client, namespace: str, name: str, instances: int, ranks: int, timeout: float
) -> tuple[int, dict[str, Any]]:
    """Change the engine args (a new pod template) and poll until every decode pod was replaced
    and the deployment is Ready; returns the fewest instances serving at any poll, and the object."""
    before = _uids(engine_pods(api, namespace, name))
    patch = {"spec": {"engine": {"extraArgs": ["--trust-remote-code", "--cuda-graph-max-bs-decode", "64"]}}}
    resp = api.patch(
        moed_path(namespace, name), json=patch, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert resp.status_code == 200, resp.text
    min_serving, deadline = instances, time.monotonic() + timeout
    while time.monotonic() < deadline:
        got: dict[str, Any] = api.get(moed_path(namespace, name)).json()
        pods = engine_pods(api, namespace, name)
        groups = pods_by_instance(pods)
        serving = sum(
            1
            for i in range(instances)
            if len(members := groups.get(("decode", str(i)), [])) == ranks
            and all(pod_ready(p) for p in members)
        )
        min_serving = min(min_serving, serving)
        uids = _uids(pods)
        if (
            len(uids) == instances * ranks
            and not set(uids.values()) & set(before.values())
            and condition(got, "Ready")["status"] == "True"
        ):
            return min_serving, got
        time.sleep(0.2)
    raise AssertionError(f"the roll did not finish in {timeout:.0f}s: {got.get('status')}")


def test_spec_change_rolls_one_instance_at_a_time(api: httpx.Client, deployed: str) -> None:
    obj = example("deepseek-v3-gb200.yaml")
    obj["metadata"]["name"] = "rolling"
    obj["spec"].pop("prefill")
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 2, "attentionDataParallel": 8})
    obj["spec"]["eplb"]["redundantExperts"] = 8
    assert api.post(moed_path(deployed), json=obj).status_code == 201
    wait_ready(api, deployed, "rolling")
    min_ready, got = change_spec_and_watch_roll(api, deployed, "rolling", instances=2, ranks=2, timeout=120)
    assert min_ready >= 1, "both instances were down at once during the roll"
    assert got["status"]["pools"]["decode"]["updatedReplicas"] == 2


def test_scale_subresource_and_hpa_scale_the_decode_pool(api: httpx.Client, deployed: str) -> None:
    """kubectl scale and the HPA controller act on spec.decode.replicas through /scale."""
    obj = example("qwen3-30b-a3b-single-node.yaml")
    obj["metadata"]["name"] = "scaled"
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    wait_ready(api, deployed, "scaled")
    scale_path = moed_path(deployed, "scaled") + "/scale"

    scale = api.get(scale_path).json()
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1, scale
    assert scale["status"]["replicas"] == 1
    assert "moe.inference.dev/pool=decode" in scale["status"]["selector"], scale

    # What `kubectl scale --replicas 2` sends.
    resp = api.patch(
        scale_path, json={"spec": {"replicas": 2}}, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert resp.status_code == 200, resp.text
    wait_for(
        lambda: len(pods_by_instance(engine_pods(api, deployed, "scaled"))) == 2,
        60,
        interval=0.5,
        what="a second decode instance",
    )
    wait_ready(api, deployed, "scaled")
    assert api.get(scale_path).json()["status"]["replicas"] == 2

    # The real HPA controller (kube-controller-manager) raises the pool to minReplicas via /scale;
    # no metrics pipeline is needed for that step.
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "scaled-decode"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "moe.inference.dev/v1alpha1", "kind": "MoEDeployment", "name": "scaled"},
            "minReplicas": 3,
            "maxReplicas": 4,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
    }  # fmt: skip
    hpa_path = f"/apis/autoscaling/v2/namespaces/{deployed}/horizontalpodautoscalers"
    assert api.post(hpa_path, json=hpa).status_code == 201
    try:
        wait_for(
            lambda: api.get(moed_path(deployed, "scaled")).json()["spec"]["decode"]["replicas"] == 3,
            90,
            interval=1,
            what="the HPA to scale the decode pool to 3",
        )
        wait_for(
            lambda: len(pods_by_instance(engine_pods(api, deployed, "scaled"))) == 3,
            60,
            interval=0.5,
            what="a third decode instance",
        )
        status = api.get(f"{hpa_path}/scaled-decode").json()["status"]
        assert status.get("desiredReplicas") == 3, status
    finally:
        api.delete(f"{hpa_path}/scaled-decode")


def test_a_burst_of_deployments_gets_disjoint_nodes_without_replanning(
    api: httpx.Client, deployed: str
) -> None:
    """Many deployments applied at once are planned one after another: none takes another's nodes,
    so none is moved (and restarted) on a later reconcile."""
    names = [f"burst-{i:02d}" for i in range(10)]
    for name in names:
        obj = example("qwen3-30b-a3b-single-node.yaml")
        obj["metadata"]["name"] = name
        assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    for name in names:
        wait_ready(api, deployed, name, timeout=180)
    time.sleep(6)  # at least one more periodic reconcile of every deployment
    pods = [p for name in names for p in engine_pods(api, deployed, name)]
    nodes = [p["spec"]["nodeName"] for p in pods]
    assert len(pods) == len(names), [p["metadata"]["name"] for p in pods]
    assert len(set(nodes)) == len(names), f"two deployments share a node: {sorted(nodes)}"
    stss = api.get(f"/apis/apps/v1/namespaces/{deployed}/statefulsets").json()["items"]
    replanned = [s["metadata"]["name"] for s in stss if s["metadata"]["generation"] != 1]
    assert not replanned, f"re-planned after creation: {replanned}"
    for name in names:
        api.delete(moed_path(deployed, name))
