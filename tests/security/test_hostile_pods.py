"""The operator against hostile pods on the sandbox (issue 15): an impostor pod with an engine's labels
gets no request (so no token) and causes no restart; a hostile runtime's answers (huge, slow,
future-dated) leave the operator's memory bounded while the other pool keeps balancing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.testing import wait_for
from operator_harness import (
    OperatorProcess,
    bind_model_volume,
    moed_path,
    pod_instance,
    runtime_credentials,
    start_replay,
)

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).with_name("hostile_runtime.py")
REFRESH_S = 10


def _spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
    obj["metadata"]["name"] = name
    obj["spec"]["topology"]["rdmaResourceName"] = "rdma/ib"  # EP16 normal kernels on GB200 need RDMA
    obj["spec"]["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    obj["spec"]["eplb"].update(
        {
            "refreshInterval": f"{REFRESH_S}s",
            "minInterval": f"{REFRESH_S}s",
            "history": "2m",
            "minImprovement": 0.02,
        }
    )
    return obj


def _leaders(api: httpx.Client, namespace: str, name: str, pool: str, count: int) -> list[dict[str, Any]]:
    selector = (
        f"moe.inference.dev/deployment={name},moe.inference.dev/pool={pool},apps.kubernetes.io/pod-index=0"
    )

    def found() -> list[dict[str, Any]] | None:
        items = api.get(f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}).json()[
            "items"
        ]
        ready = [p for p in items if p["status"].get("podIP") and p["metadata"].get("ownerReferences")]
        return sorted(ready, key=lambda p: p["metadata"]["name"]) if len(ready) == count else None

    result: list[dict[str, Any]] = wait_for(found, 180, interval=1, what=f"{count} {pool} leader(s) with IPs")
    return result


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL: a runtime stuck writing a byte-a-second answer must not fail the test."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _requests(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_impostor_pod_gets_no_request_and_restarts_nothing(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    bind_model_volume(api, namespace, "models")
    obj = _spec("imp")
    obj["spec"].pop("prefill")
    obj["spec"]["decode"].update({"replicas": 1, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"]["redundantExperts"] = 16
    assert api.post(moed_path(namespace), json=obj).status_code == 201
    (leader,) = _leaders(api, namespace, "imp", "decode", 1)
    token_file, _ = runtime_credentials(api, namespace, "imp", tmp_path / "token")
    replay = start_replay(
        leader["status"]["podIP"], token_file, tmp_path / "replay.log", instance=pod_instance(leader),
        model="deepseek-v3", gpus=16, gpus_per_node=4, redundant=16,
    )  # fmt: skip
    impostor_log = tmp_path / "impostor.jsonl"
    impostor_proc: subprocess.Popen[bytes] | None = None
    try:
        # A bare pod that carries the leader's labels and runs next to it: no owner, another name.
        labels = dict(leader["metadata"]["labels"])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "imp-decode-0-impostor", "labels": labels},
            "spec": {
                "nodeName": leader["spec"]["nodeName"],
                "containers": [{"name": "x", "image": "busybox"}],
                "tolerations": [{"operator": "Exists"}],
            },
        }
        assert api.post(f"/api/v1/namespaces/{namespace}/pods", json=pod).status_code == 201

        def impostor_ip() -> str | None:
            ip: str | None = (
                api.get(f"/api/v1/namespaces/{namespace}/pods/imp-decode-0-impostor")
                .json()["status"]
                .get("podIP")
            )
            return ip if ip and ip != leader["status"]["podIP"] else None

        ip = wait_for(impostor_ip, 60, what="impostor pod IP")
        impostor_proc = subprocess.Popen(
            [sys.executable, str(HOSTILE), ip, "9400", str(impostor_log), "61", "256"],
            stdout=(tmp_path / "impostor.out").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip

        def published() -> dict[str, Any] | None:
            status = api.get(moed_path(namespace, "imp")).json().get("status") or {}
            placement = (status.get("placement") or {}).get("decode") or {}
            return status if placement.get("version") else None

        status = wait_for(
            published, 6 * REFRESH_S, interval=1, what="a placement published from the real leader"
        )
        time.sleep(2 * REFRESH_S)  # two more evaluations with the impostor in place
        assert _requests(impostor_log) == [], "the operator talked to a pod it did not create"
        status = api.get(moed_path(namespace, "imp")).json()["status"]
        assert status["pools"]["decode"]["groupRestarts"] == 0
        now = api.get(f"/api/v1/namespaces/{namespace}/pods/{leader['metadata']['name']}").json()
        assert now["metadata"]["uid"] == leader["metadata"]["uid"], "the real group was restarted"
    finally:
        for proc in (replay, impostor_proc):
            if proc is not None:
                _stop(proc)


def test_hostile_runtime_answers_leave_memory_bounded_and_the_other_pool_balancing(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    bind_model_volume(api, namespace, "models")
    obj = _spec("hostile")
    obj["spec"]["prefill"].update({"replicas": 2, "nodesPerReplica": 8})  # EP32: the replays' shape
    assert api.post(moed_path(namespace), json=obj).status_code == 201, "spec refused"
    prefill = _leaders(api, namespace, "hostile", "prefill", 2)
    (decode,) = _leaders(api, namespace, "hostile", "decode", 1)
    token, _ = runtime_credentials(api, namespace, "hostile", tmp_path / "token")
    assert moe_operator.proc is not None
    before = _peak_rss_mb(moe_operator.proc.pid)
    procs = [
        start_replay(
            p["status"]["podIP"],
            token,
            tmp_path / f"replay-{i}.log",
            instance=pod_instance(p),
            model="deepseek-v3",
            gpus=32,
            gpus_per_node=4,
            redundant=32,
        )
        for i, p in enumerate(prefill)
    ]
    hostile_log = tmp_path / "hostile.jsonl"
    procs.append(
        subprocess.Popen(
            [sys.executable, str(HOSTILE), decode["status"]["podIP"], "9400", str(hostile_log), "61", "256"],
            stdout=(tmp_path / "hostile.out").open("ab"),
            stderr=subprocess.STDOUT,
        )
    )
    try:

        def placement(pool: str) -> dict[str, Any]:
            status = api.get(moed_path(namespace, "hostile")).json().get("status") or {}
            out: dict[str, Any] = (status.get("placement") or {}).get(pool) or {}
            return out

        wait_for(
            lambda: placement("prefill").get("version"), 8 * REFRESH_S, interval=1, what="prefill balanced"
        )
        wait_for(
            lambda: len(_requests(hostile_log)) >= 3,
            8 * REFRESH_S,
            interval=1,
            what="all three hostile answers",
        )
        decode_msg = placement("decode").get("message", "")
        assert "unreachable" in decode_msg or "no fresh" in decode_msg, decode_msg
        assert not placement("decode").get("version"), "future-dated or oversized windows were used"
        peak = _peak_rss_mb(moe_operator.proc.pid)
        # The 200 MB answer is cut at the collector's byte cap (64 MB), never parsed whole.
        assert peak - before < 200, f"operator peak RSS grew from {before:.0f} to {peak:.0f} MB"
    finally:
        for proc in procs:
            _stop(proc)
