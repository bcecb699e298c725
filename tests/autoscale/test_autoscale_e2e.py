"""The autoscaler end to end: real sandbox, real operator, one replay engine per instance leader.

The replay engines' latency follows their offered load (moe_runtime/replay/load.py); the test
plays the router: it spreads a total request rate over the instances status.autoscaling lists
as serving, and sends nothing to the others. A load step breaches the ITL SLO -> a second
instance is created, listed once ready, and the SLO holds again; the load falls -> the second
instance is taken off the list, finishes what it runs, and only then is its group removed.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_contract.auth import instance_token
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, moed_path, runtime_credentials, start_replay

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SLO_ITL = 0.06


def test_scale_out_on_breach_then_drain_and_scale_in(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    name = obj["metadata"]["name"]
    obj["spec"]["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    obj["spec"]["monitoring"] = {"podMonitor": False, "prometheusRule": False}
    obj["spec"]["decode"]["autoscaling"] = {
        "mode": "Operator", "minReplicas": 1, "maxReplicas": 2,
        "slo": {"itl": f"{int(SLO_ITL * 1000)}ms", "percentile": 90},
        "bootTime": "30s", "scaleOutCooldown": "10s", "scaleInCooldown": "30s", "scaleInWindow": "1m",
        "drainTimeout": "5m", "burstMemory": "1m",
    }  # fmt: skip
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    pods_path = f"/api/v1/namespaces/{deployed}/pods"
    selector = f"moe.inference.dev/deployment={name},apps.kubernetes.io/pod-index=0"
    wait_for(lambda: api.get(f"/api/v1/namespaces/{deployed}/secrets/{name}-runtime-token").status_code == 200,
             60, what="the runtime token Secret")  # fmt: skip
    token_file, key = runtime_credentials(api, deployed, name, tmp_path / "token")
    replays: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}  # instance -> (ip, process)
    total = {"rate": 3.0}
    timeline: list[str] = []
    start = time.monotonic()

    def status() -> dict[str, Any]:
        st = api.get(moed_path(deployed, name)).json().get("status") or {}
        out: dict[str, Any] = (st.get("autoscaling") or {}).get("decode") or {}
        return out

    def replay_state(instance: str) -> dict[str, Any]:
        ip = replays[instance][0]
        body: dict[str, Any] = httpx.get(f"http://{ip}:9400/v1/replay", timeout=5).json()["load"]
        return body

    def play_router() -> dict[str, Any]:
        """Start a replay engine on each new leader; offer the load to the serving instances only."""
        for pod in api.get(pods_path, params={"labelSelector": selector}).json()["items"]:
            ip, pod_name = pod["status"].get("podIP"), pod["metadata"]["name"]
            instance = pod_name.rsplit("-", 1)[0]
            if ip and instance not in replays and not pod["metadata"].get("deletionTimestamp"):
                proc = start_replay(
                    ip, token_file, tmp_path / f"{instance}.log", instance=instance, model="qwen3-30b-a3b",
                    gpus=8, gpus_per_node=8, redundant=8, role="standalone", request_rate=0.0,
                )  # fmt: skip
                replays[instance] = (ip, proc)
                time.sleep(1.0)
        st = status()
        serving = int(st.get("serving") or 1)
        for instance, (ip, _) in replays.items():
            index = int(instance.rsplit("-", 1)[1])
            rate = total["rate"] / serving if index < serving else 0.0
            auth = {"Authorization": f"Bearer {instance_token(key, instance)}"}
            with contextlib.suppress(httpx.HTTPError):  # not listening yet
                httpx.post(
                    f"http://{ip}:9400/v1/replay/load", json={"requestRate": rate}, headers=auth, timeout=5
                )
        timeline.append(
            f"t={time.monotonic() - start:5.1f}s rate={total['rate']} instances={st.get('instances')} "
            f"serving={st.get('serving')} reason={st.get('reason')} latency={st.get('latency')}"
        )
        return st

    def events() -> list[str]:
        items = api.get(f"/api/v1/namespaces/{deployed}/events").json()["items"]
        return [
            f"{e['reason']}: {e.get('message', '')}" for e in items if e["involvedObject"].get("name") == name
        ]

    try:
        # steady: 3 requests/s on one instance is well inside the SLO
        wait_for(lambda: play_router().get("reason") in ("steady", "cooldown") and play_router().get("latency"),
                 120, interval=1, what="the autoscaler measuring one steady instance")  # fmt: skip
        assert status()["instances"] == 1
        # a load step past one instance's capacity at the SLO: scale out, listed once ready, SLO holds
        total["rate"] = 9.0
        wait_for(lambda: play_router().get("serving") == 2, 120, interval=1, what="a second instance serving")
        assert any(e.startswith("ScalingOut") for e in events()) and any(
            e.startswith("ScaledOut") for e in events()
        )

        def itl_inside() -> bool:
            latency = play_router().get("latency") or {}
            return latency.get("itl") is not None and latency["itl"] <= SLO_ITL

        wait_for(itl_inside, 60, interval=1, what="the ITL SLO holding on two instances")
        # load falls: the second instance is drained (off the router), then removed
        total["rate"] = 2.0
        wait_for(lambda: play_router().get("reason") == "draining", 240, interval=1, what="a drain")
        assert status()["instances"] == 2 and status()["serving"] == 1
        wait_for(
            lambda: play_router().get("instances") == 1, 120, interval=1, what="the drained instance removed"
        )
        said = events()
        assert any(e.startswith("ScaledIn") for e in said), said
        assert not any(e.startswith("DrainTimedOut") for e in said), said
        leaving = replay_state(f"{name}-decode-1")
        assert leaving["running"] == 0 and leaving["queued"] == 0  # nothing was cut off
        assert all(replay_state(i)["dropped"] == 0 for i in replays)  # no request refused anywhere
        wait_for(
            lambda: len(api.get(pods_path, params={"labelSelector": selector}).json()["items"]) == 1,
            60, what="the second instance's pods gone",
        )  # fmt: skip
    except BaseException:
        print("\n".join(timeline[-60:]))
        print("\n".join(events()))
        print(moe_operator.tail())
        raise
    finally:
        for _, proc in replays.values():
            proc.terminate()
        for _, proc in replays.values():
            proc.wait(timeout=10)
