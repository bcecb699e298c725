"""Chaos on the sandbox's control plane and nodes: node loss, kube-apiserver restart, a crash-looping
engine. Each scenario checks nothing else was touched, the conditions told the truth, and records
its recovery time (printed, never asserted)."""

from __future__ import annotations

import itertools
import time
from datetime import datetime
from typing import Any

import httpx
import pytest
from e2e_moe import (
    Recovery,
    Sampler,
    by_instance,
    condition,
    engine_pods,
    events,
    get_moed,
    identity,
    is_ready,
    merge_patch,
    moed_path,
    pod_serving,
    qwen3,
    wait_ready,
)
from e2e_target import Target

from moe_sandbox.testing import wait_for

pytestmark = pytest.mark.cluster

EPOCH = "moe.inference.dev/group-epoch"


def _create(api: httpx.Client, namespace: str, obj: dict[str, Any]) -> str:
    resp = api.post(moed_path(namespace), json=obj)
    assert resp.status_code == 201, resp.text
    name: str = obj["metadata"]["name"]
    wait_ready(api, namespace, name)
    return name


@pytest.mark.sandbox_only("deletes a node")
def test_node_loss_moves_only_the_instance_on_it(
    api: httpx.Client, deployed: str, target: Target, recovery: Recovery
) -> None:
    box, _ = target.require_sandbox()
    name = _create(api, deployed, qwen3(2))
    groups = by_instance(engine_pods(api, deployed, name))
    lost = groups[("decode", 0)][0]["spec"]["nodeName"]
    untouched = identity(groups[("decode", 1)])
    saved = api.get(f"/api/v1/nodes/{lost}").json()

    def truth() -> tuple[str, int]:
        obj = get_moed(api, deployed, name)
        return condition(obj, "Ready").get("status", ""), obj["status"]["pools"]["decode"]["readyReplicas"]

    start = time.monotonic()
    api.delete(f"/api/v1/nodes/{lost}").raise_for_status()
    try:
        with Sampler(truth) as seen:

            def moved() -> bool:
                now = by_instance(engine_pods(api, deployed, name)).get(("decode", 0), [])
                return len(now) == 1 and now[0]["spec"].get("nodeName") != lost and pod_serving(now[0])

            wait_for(moved, 180, interval=0.5, what="instance 0 running on another node")
            recovery.record("instance 0 serving on another node", time.monotonic() - start)
            wait_ready(api, deployed, name)
            recovery.record("Ready=True again", time.monotonic() - start)
        after = by_instance(engine_pods(api, deployed, name))
        assert identity(after[("decode", 1)]) == untouched, "instance 1 was restarted"
        assert after[("decode", 0)][0]["spec"]["nodeName"] != lost
        # The status admitted the loss while it lasted: Ready=False with one instance ready.
        assert ("False", 1) in [v for _, v in seen.samples], seen.samples[:20]
        moves = [e for e in events(api, deployed, "GroupRestarting") if "decode instance 0" in e["message"]]
        assert moves and "moved" in moves[0]["message"], moves
    finally:
        node = {k: saved[k] for k in ("apiVersion", "kind", "spec", "status")}
        node["metadata"] = {k: saved["metadata"][k] for k in ("name", "labels", "annotations")}
        with box.client() as c:
            box.create_node(node, c)
        box.wait_nodes_ready({lost}, log=lambda _m: None)


@pytest.mark.sandbox_only("restarts the kube-apiserver process")
def test_apiserver_restart_keeps_operator_and_status(
    api: httpx.Client, deployed: str, target: Target, recovery: Recovery
) -> None:
    box, operator = target.require_sandbox()
    name = _create(api, deployed, qwen3(1))
    pods = identity(engine_pods(api, deployed, name))
    assert operator.proc is not None
    pid = operator.proc.pid

    outage = box.restart_apiserver(downtime=3, log=lambda m: print(f"[chaos] {m}"))
    recovery.record("kube-apiserver restart (stop, 3 s down, start) until ready", outage)
    start = time.monotonic()
    with box.client(timeout=30) as fresh:
        assert operator.proc is not None and operator.proc.pid == pid and operator.proc.poll() is None, (
            operator.tail()
        )
        # Nothing changed on the engines, so the status must still say Ready with the same pods.
        obj = get_moed(fresh, deployed, name)
        assert is_ready(obj), obj.get("status")
        assert identity(engine_pods(fresh, deployed, name)) == pods
        # The operator re-watched: a spec change made after the restart is reconciled.
        merge_patch(fresh, moed_path(deployed, name), {"spec": {"decode": {"replicas": 2}}})
        obj = wait_ready(fresh, deployed, name, timeout=120)
        recovery.record("spec change after the restart reconciled (2/2 Ready)", time.monotonic() - start)
        assert obj["status"]["pools"]["decode"]["readyReplicas"] == 2
        groups = by_instance(engine_pods(fresh, deployed, name))
        assert identity(groups[("decode", 0)]) == pods, "instance 0 was restarted by the scale-up"
        assert operator.proc is not None and operator.proc.pid == pid


def _crash(api: httpx.Client, pod: dict[str, Any], restarts: int) -> None:
    """Report the engine container as crashed, the way a kubelet does (kwok leaves Running pods be)."""
    now = datetime.now().astimezone().isoformat(timespec="seconds")
    engine = pod["spec"]["containers"][0]["name"]
    statuses = []
    for cs in pod["status"]["containerStatuses"]:
        if cs["name"] == engine:
            cs = {
                **cs,
                "ready": False,
                "started": False,
                "restartCount": restarts,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}},
                "lastState": {
                    "terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}
                },
            }
        statuses.append(cs)
    conditions = [
        {**c, "status": "False", "lastTransitionTime": now}
        if c["type"] in ("Ready", "ContainersReady")
        else c
        for c in pod["status"]["conditions"]
    ]
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}/status"
    merge_patch(api, path, {"status": {"containerStatuses": statuses, "conditions": conditions}})


@pytest.mark.sandbox_only("writes pod status as a kubelet would; a real kubelet overwrites it")
def test_crash_loop_restarts_the_group_with_backoff(
    api: httpx.Client, deployed: str, target: Target, recovery: Recovery
) -> None:
    target.require_sandbox()
    name = _create(api, deployed, qwen3(2))
    groups = by_instance(engine_pods(api, deployed, name))
    untouched = identity(groups[("decode", 1)])
    sts = f"/apis/apps/v1/namespaces/{deployed}/statefulsets/{name}-decode-0"
    crashed: set[str] = set()
    epochs: list[datetime] = []

    def status() -> tuple[str, str, str, str]:
        obj = get_moed(api, deployed, name)
        ready, degraded = condition(obj, "Ready"), condition(obj, "Degraded")
        return (
            ready.get("status", ""),
            ready.get("reason", ""),
            degraded.get("reason", ""),
            degraded.get("message", ""),
        )

    with Sampler(status) as seen:
        for n in range(1, 4):

            def fresh_pod() -> dict[str, Any] | None:
                now = by_instance(engine_pods(api, deployed, name)).get(("decode", 0), [])
                ok = [p for p in now if p["metadata"]["uid"] not in crashed and pod_serving(p)]
                return ok[0] if ok else None

            pod = wait_for(fresh_pod, 120, interval=0.5, what=f"instance 0 running before crash {n}")
            crashed.add(pod["metadata"]["uid"])
            _crash(api, pod, 1)
            last_crash = time.monotonic()

            def restarted(n: int = n) -> bool:
                ann = api.get(sts).json()["metadata"].get("annotations") or {}
                return ann.get("moe.inference.dev/group-restarts") == str(n)

            wait_for(restarted, 120, interval=0.5, what=f"group restart {n}")
            epochs.append(datetime.fromisoformat(api.get(sts).json()["metadata"]["annotations"][EPOCH]))
            recovery.record(
                f"crash {n} -> whole group restarted (backoff incl.)", time.monotonic() - last_crash
            )
        obj = wait_ready(api, deployed, name)
        recovery.record("last crash -> Ready=True again", time.monotonic() - last_crash)

    # Exponential backoff, from the operator's own restart timestamps: 10 s, then 20 s.
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(epochs)]
    assert gaps[0] >= 10 and gaps[1] >= 20, gaps
    assert obj["status"]["pools"]["decode"]["groupRestarts"] == 3
    assert condition(obj, "Degraded")["status"] == "False"
    # The status said why while it waited, and the events name every restart.
    values = [v for _, v in seen.samples]
    assert any(r == "False" and rr == "GroupRestarting" for r, rr, _, _ in values), values[:20]
    # While it waits out the backoff, Degraded says so with its own reason and a message that
    # names the restart time (stable, so the status is not rewritten on every reconcile).
    backoff = [m for _, _, d, m in values if d == "RestartBackoff"]
    assert backoff and all("decode instance 0" in m for m in backoff), sorted(set(values))
    assert any("(restart 3, exponential backoff)" in m for m in backoff), sorted(set(backoff))
    # One event per restart: the Ready transition does not repeat the decision's event.
    posted = [e["message"] for e in events(api, deployed, "GroupRestarting")]
    print(f"\n{len(posted)} GroupRestarting events for 3 restarts")
    assert len(posted) == 3, posted
    assert all(m.startswith("decode instance 0:") for m in posted), posted
    assert any(m.endswith("restarting all 1 ranks together") for m in posted), posted
    assert identity(by_instance(engine_pods(api, deployed, name))[("decode", 1)]) == untouched
