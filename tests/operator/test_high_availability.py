"""Two operator replicas against one sandbox, elected through kopf peering (issue 15, item 7): one
acts, the other waits; after a kill -9 of the leader the other takes over within 30 s, and the
writes never alternate between them."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_reconciler import example

from moe_sandbox.cluster import Sandbox, server_side_apply
from moe_sandbox.testing import wait_for
from operator_harness import PEERING, OperatorProcess, bind_model_volume, moed_path, remove_peering

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
ARGS = ("--no-webhook", "--peering", "moe-operator", "--peering-required", "--peering-lifetime", "10")


@pytest.fixture()
def replicas(
    sandbox: Sandbox, moe_operator: OperatorProcess, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    with sandbox.client() as api:
        for crd in yaml.safe_load_all((REPO / "crds" / "kopf.dev-peerings.yaml").read_text()):
            server_side_apply(
                api,
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                crd,
                "moe-tests",
            )
        wait_for(lambda: api.get(PEERING).status_code == 200, 30, what="peering CRD served")
        api.post(
            PEERING,
            json={
                "apiVersion": "kopf.dev/v1",
                "kind": "ClusterKopfPeering",
                "metadata": {"name": "moe-operator"},
            },
        )
    moe_operator.stop()
    a = OperatorProcess(sandbox, tmp_path, port_base=19500, user="moe-operator-a", extra_args=ARGS)
    b = OperatorProcess(sandbox, tmp_path, port_base=19700, user="moe-operator-b", extra_args=ARGS)
    try:
        a.start()
        time.sleep(1)  # a is older: it leads
        b.start()
        yield [a, b]
    finally:
        for proc in (a, b):
            proc.stop(signal.SIGKILL)
        with sandbox.client() as api:
            # The other tests' operator runs alone again: with the peering CRD still served and no
            # object, kopf would patch the missing record every few seconds (404 writes that the
            # idle-operator test counts), so the CRD goes too.
            remove_peering(api)
        moe_operator.start()


def _writes(box: Sandbox, namespace: str, since: float = 0.0) -> list[tuple[str, str]]:
    """(user, resource) of every write in the namespace the audit log holds, events left out."""
    out = []
    with open(box.audit_log) as log:
        for line in log:
            e = json.loads(line)
            ref = e.get("objectRef") or {}
            if (
                e.get("stage") == "ResponseComplete"
                and e.get("verb") not in ("get", "list", "watch")
                and ref.get("namespace") == namespace
                and ref.get("resource") != "events"
                and e["user"]["username"].startswith("moe-operator-")
                and _ts(e["requestReceivedTimestamp"]) >= since
            ):
                out.append((e["user"]["username"], ref.get("resource", "")))
    return out


def _ts(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _deploy(api: httpx.Client, namespace: str, name: str) -> None:
    obj: dict[str, Any] = example("qwen3-30b-a3b-single-node.yaml")
    obj["metadata"]["name"] = name
    assert api.post(moed_path(namespace), json=obj).status_code == 201


def _children(api: httpx.Client, namespace: str, name: str) -> bool:
    items = api.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets").json()["items"]
    return any(s["metadata"]["name"].startswith(f"{name}-") for s in items)


def test_one_replica_acts_and_the_other_takes_over_after_a_kill(
    sandbox: Sandbox, api: httpx.Client, namespace: str, replicas: list[OperatorProcess]
) -> None:
    a, b = replicas
    bind_model_volume(api, namespace, "qwen3-30b-a3b")
    _deploy(api, namespace, "first")
    wait_for(lambda: _children(api, namespace, "first"), 60, what="children of the first deployment")
    time.sleep(5)
    users = {u for u, _ in _writes(sandbox, namespace)}
    assert users == {"moe-operator-a"}, f"writes by {users}: both replicas acted"

    assert a.proc is not None
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    killed = time.time()
    _deploy(api, namespace, "second")
    # The election is what the peering lifetime (10 s) bounds; the children come after it, at the
    # speed of a loaded machine.
    wait_for(lambda: "Resuming operations" in b.tail(400), 45, interval=0.5, what="the standby resumed")
    elected = time.time() - killed
    wait_for(lambda: _children(api, namespace, "second"), 90, interval=0.5, what="the standby took over")
    took = time.time() - killed
    print(f"\nfailover: the standby resumed {elected:.1f}s and created the new deployment's children "
          f"{took:.1f}s after the kill -9")  # fmt: skip
    assert elected < 30

    settle = time.time()
    time.sleep(20)
    later = {u for u, _ in _writes(sandbox, namespace, since=settle)}
    assert later <= {"moe-operator-b"}, later
    assert b.tail(400).count("Pausing operations") <= 1, "the standby paused again after taking over"

    # Deleted while the leader still runs (it owns the finalizers), so no later test's operator
    # inherits them from a namespace stuck terminating.
    # A tick in flight at the delete holds the finalizer for seconds (configure_timer_exit), not 60 s.
    for name in ("first", "second"):
        api.delete(f"{moed_path(namespace)}/{name}")
    try:
        wait_for(
            lambda: not api.get(moed_path(namespace)).json()["items"], 60, interval=0.5, what="both deleted"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe leader's log:\n{b.tail(60)}") from None
