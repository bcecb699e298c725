"""groupBackend LeaderWorkerSet on the sandbox, with the real LeaderWorkerSet controller (built from
sigs.k8s.io/lws): instances in their planned domain, whole-group restarts and one-at-a-time rolls;
without the controller the deployment waits with a condition and nothing is created."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from test_reconciler import (
    _uids,
    change_spec_and_watch_roll,
    condition,
    engine_pods,
    example,
    node_labels,
    pods_by_instance,
    wait_ready,
)

from moe_sandbox import leaderworkerset as lws
from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, bind_model_volume, moed_path

pytestmark = pytest.mark.cluster

LWS_PATH = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets"


@pytest.fixture()
def with_leaderworkerset(sandbox: Sandbox, moe_operator: OperatorProcess) -> Iterator[None]:
    """The controller, CRD and webhooks for this test only (other tests' auto must stay
    StatefulSet); afterwards the operator restarts so that it stops watching LeaderWorkerSets."""
    if lws.uninstall(sandbox):  # left by an interrupted run: the operator must start without it
        moe_operator.restart()
    print(f"\nLeaderWorkerSet installed in {lws.install(sandbox):.1f}s")
    try:
        yield
    finally:
        lws.uninstall(sandbox)
        moe_operator.restart()


def _spec(backend: str) -> dict[str, object]:
    obj = example("deepseek-v3-gb200.yaml")
    obj["metadata"]["name"] = "lws"
    obj["spec"].pop("prefill")
    obj["spec"]["topology"]["rdmaResourceName"] = "rdma/ib"  # EP16 normal kernels on GB200 need RDMA

    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"]["redundantExperts"] = 16
    obj["spec"]["topology"]["groupBackend"] = backend
    return obj


def test_leaderworkerset_groups_run_restart_and_roll(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess, with_leaderworkerset: None
) -> None:
    bind_model_volume(api, namespace, "models")
    assert api.post(moed_path(namespace), json=_spec("auto")).status_code == 201
    # Installed after the operator started: it cannot watch the sets yet, and says so.
    waiting = wait_for(
        lambda: _ready_reason(api, namespace, "LeaderWorkerSetNotWatched"),
        60,
        what="LeaderWorkerSetNotWatched",
    )
    assert "restart the operator" in waiting["message"]
    assert not api.get(LWS_PATH.format(ns=namespace)).json()["items"]
    moe_operator.restart()
    # auto picks LeaderWorkerSet because the cluster serves it now.
    status = wait_ready(api, namespace, "lws", timeout=180)["status"]
    assert status["pools"]["decode"]["groupBackend"] == "LeaderWorkerSet"
    sets = api.get(LWS_PATH.format(ns=namespace)).json()["items"]
    assert sorted(s["metadata"]["name"] for s in sets) == ["lws-decode-0", "lws-decode-1"]
    ours = api.get(
        f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
        params={"labelSelector": "moe.inference.dev/deployment=lws"},
    ).json()["items"]
    assert not ours, "the operator rendered StatefulSets besides the LeaderWorkerSets"

    groups = pods_by_instance(engine_pods(api, namespace, "lws"))
    for i in ("0", "1"):
        members = groups[("decode", i)]
        assert sorted(
            p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] for p in members
        ) == [
            "0",
            "1",
            "2",
            "3",
        ]
        # From the scheduler's bindings and the nodes' labels: one NVLink clique per instance.
        nodes = {p["spec"]["nodeName"] for p in members}
        assert len(nodes) == 4
        cliques = {node_labels(api, n)["nvidia.com/gpu.clique"] for n in nodes}
        assert len(cliques) == 1, f"decode-{i} spans {cliques}"

    # Kill one worker of instance 1: the operator restarts all its ranks; instance 0 keeps running.
    before_0, before_1 = _uids(groups[("decode", "0")]), _uids(groups[("decode", "1")])
    api.delete(f"/api/v1/namespaces/{namespace}/pods/lws-decode-1-0-2")

    def restarted() -> bool:
        uids = _uids(pods_by_instance(engine_pods(api, namespace, "lws")).get(("decode", "1"), []))
        return len(uids) == 4 and not set(uids.values()) & set(before_1.values())

    wait_for(restarted, 120, interval=0.5, what="whole instance 1 restarted")
    wait_ready(api, namespace, "lws", timeout=120)
    assert _uids(pods_by_instance(engine_pods(api, namespace, "lws"))[("decode", "0")]) == before_0
    got = api.get(moed_path(namespace, "lws")).json()
    assert got["status"]["pools"]["decode"]["groupRestarts"] >= 1

    # A spec change rolls the instances one at a time; the pool keeps serving.
    min_serving, got = change_spec_and_watch_roll(api, namespace, "lws", instances=2, ranks=4, timeout=180)
    assert min_serving >= 1, "both instances were down at once during the roll"
    assert got["status"]["pools"]["decode"]["updatedReplicas"] == 2
    api.delete(moed_path(namespace, "lws"))


def test_leaderworkerset_requested_without_the_controller_waits_with_a_reason(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess
) -> None:
    bind_model_volume(api, namespace, "models")
    assert api.post(moed_path(namespace), json=_spec("LeaderWorkerSet")).status_code == 201

    ready = wait_for(
        lambda: _ready_reason(api, namespace, "LeaderWorkerSetNotInstalled"),
        60,
        what="LeaderWorkerSetNotInstalled",
    )
    assert ready["status"] == "False" and "install the LeaderWorkerSet controller" in ready["message"]
    children = api.get(
        f"/api/v1/namespaces/{namespace}/configmaps",
        params={"labelSelector": "moe.inference.dev/deployment=lws"},
    ).json()["items"]
    assert not children, "children were created for a deployment that cannot run"


def _ready_reason(api: httpx.Client, namespace: str, reason: str) -> dict[str, str] | None:
    ready = condition(api.get(moed_path(namespace, "lws")).json(), "Ready")
    return ready if ready.get("reason") == reason else None
