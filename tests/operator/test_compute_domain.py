"""GB200 NVL72 on the sandbox: one ComputeDomain per NVLink domain a deployment's multi-node
instances use, and the IMEX channel claim in each of their pods, against a fake of NVIDIA's DRA
driver (moe_sandbox.compute_domain: the real CRD schema and DeviceClass, the real scheduler and
claim controller); without the driver's CRD, an event and pods without claims."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_reconciler import engine_pods, example, wait_ready

from moe_operator.render.compute_domain import CLAIM_NAME, channel_template_name, compute_domain_name
from moe_sandbox import compute_domain
from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, bind_model_volume, moed_path

pytestmark = pytest.mark.cluster
CD_PATH = "/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains"
RESOURCE = "/apis/resource.k8s.io/v1/namespaces/{ns}"
NODES = 2  # decode: one instance of two GB200 trays (EP8): the smallest that spans nodes


@pytest.fixture()
def without_compute_domains(sandbox: Sandbox, moe_operator: OperatorProcess) -> None:
    """The driver's CRD absent since the operator started (restarted only if a test left it)."""
    if compute_domain.uninstall(sandbox):
        moe_operator.restart()


@pytest.fixture()
def with_fake_dra_driver(sandbox: Sandbox, moe_operator: OperatorProcess) -> Iterator[None]:
    """The fake driver for this test only; the operator restarts around it (kopf watches what it saw
    at start)."""
    compute_domain.uninstall(sandbox)
    compute_domain.install(sandbox)
    moe_operator.restart()
    try:
        yield
    finally:
        compute_domain.uninstall(sandbox)
        moe_operator.restart()


def _spec(name: str) -> dict[str, Any]:
    """The GB200 example cut down: decode only, 1 instance x 2 trays, weights from the bound PVC."""
    obj: dict[str, Any] = example("deepseek-v3-gb200.yaml")
    obj["metadata"]["name"] = name
    spec = obj["spec"]
    spec.pop("prefill")
    spec.pop("monitoring")
    # attentionDataParallel defaults to the world (8). Set explicitly, the CRD's CEL rules read
    # spec.topology.gpusPerNode, which a hardware profile leaves unset: the apiserver refuses it.
    spec["decode"].update({"replicas": 1, "nodesPerReplica": NODES})
    spec["eplb"]["redundantExperts"] = 8  # 256 + 8 slots over 8 GPUs
    spec["topology"].pop("rdmaResourceName", None)
    spec["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    return obj


def _deploy(api: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    bind_model_volume(api, namespace, "models")
    resp = api.post(moed_path(namespace), json=_spec(name))
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


def _events(api: httpx.Client, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = api.get(f"/api/v1/namespaces/{namespace}/events").json()["items"]
    return [e for e in items if e.get("reason") == reason]


def _get(api: httpx.Client, path: str) -> dict[str, Any] | None:
    resp = api.get(path)
    return resp.json() if resp.status_code == 200 else None


def test_without_the_driver_pods_run_without_claims_and_an_event_says_why(
    api: httpx.Client, namespace: str, without_compute_domains: None
) -> None:
    _deploy(api, namespace, "nocd")
    events = wait_for(
        lambda: _events(api, namespace, "ComputeDomainSkipped"), 30, what="ComputeDomainSkipped"
    )
    assert len(events) == 1 and events[0]["type"] == "Warning", events
    assert "ComputeDomain is not served" in events[0]["message"]
    wait_ready(api, namespace, "nocd")
    pods = engine_pods(api, namespace, "nocd")
    assert len(pods) == NODES
    for pod in pods:
        assert not pod["spec"].get("resourceClaims"), pod["metadata"]["name"]
        assert not pod["spec"]["containers"][0]["resources"].get("claims")
    assert len(_events(api, namespace, "ComputeDomainSkipped")) == 1  # once per generation


def test_compute_domain_channel_claims_are_allocated_and_collected(
    api: httpx.Client, namespace: str, with_fake_dra_driver: None
) -> None:
    owner = _deploy(api, namespace, "cd")
    obj = wait_ready(api, namespace, "cd")
    pods = engine_pods(api, namespace, "cd")
    assert len(pods) == NODES
    nodes = {p["spec"]["nodeName"] for p in pods}
    cliques = {
        api.get(f"/api/v1/nodes/{n}").json()["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in nodes
    }
    assert len(nodes) == NODES and len(cliques) == 1, (nodes, cliques)
    clique = cliques.pop()

    # One ComputeDomain for the clique the instance runs in, as rendered, owned by the deployment.
    cds = api.get(CD_PATH.format(ns=namespace)).json()["items"]
    cd_name = compute_domain_name("cd", clique)
    template = channel_template_name(cd_name)
    assert [c["metadata"]["name"] for c in cds] == [cd_name]
    cd = cds[0]
    assert cd["spec"] == {
        "numNodes": 0,  # immutable in NVIDIA's CRD: a node count would block scaling
        "channel": {"resourceClaimTemplate": {"name": template}, "allocationMode": "Single"},  # defaulted
    }
    assert cd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "moe-operator"
    refs = cd["metadata"]["ownerReferences"]
    assert [(r["kind"], r["uid"]) for r in refs] == [("MoEDeployment", owner["metadata"]["uid"])]
    assert obj["metadata"]["uid"] == owner["metadata"]["uid"]

    # The (fake) driver's template, owned by the ComputeDomain.
    rct = _get(api, f"{RESOURCE.format(ns=namespace)}/resourceclaimtemplates/{template}")
    assert rct is not None
    assert rct["metadata"]["ownerReferences"][0]["uid"] == cd["metadata"]["uid"]
    assert rct["spec"]["spec"]["devices"]["requests"] == [
        {
            "name": "channel",
            "exactly": {
                "deviceClassName": compute_domain.CHANNEL_CLASS,
                "allocationMode": "ExactCount",
                "count": 1,
            },
        }
    ]

    # Every engine pod claims the channel; the scheduler allocated each claim on the pod's node.
    for pod in pods:
        where = pod["metadata"]["name"]
        assert pod["spec"]["resourceClaims"] == [{"name": CLAIM_NAME, "resourceClaimTemplateName": template}]
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}], where
        statuses = pod["status"].get("resourceClaimStatuses") or []
        assert [s["name"] for s in statuses] == [CLAIM_NAME], where
        claim = _get(
            api, f"{RESOURCE.format(ns=namespace)}/resourceclaims/{statuses[0]['resourceClaimName']}"
        )
        assert claim is not None, where
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [
            (compute_domain.DRIVER, pod["spec"]["nodeName"], "channel-0")
        ], where
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]], where

    # Deleting the deployment: garbage collection takes the ComputeDomain, then its template. The
    # garbage collector picks up a new CRD at its next discovery sync (every 30 s, fixed in
    # kube-controller-manager), so this wait is what this test spends most of its time on.
    assert api.delete(moed_path(namespace, "cd")).status_code == 200
    cd_path = f"{CD_PATH.format(ns=namespace)}/{cd_name}"
    wait_for(lambda: _get(api, cd_path) is None, 60, what="ComputeDomain collected")
    rct_path = f"{RESOURCE.format(ns=namespace)}/resourceclaimtemplates/{template}"
    wait_for(lambda: _get(api, rct_path) is None, 60, what="ResourceClaimTemplate collected")
