"""The control loop end to end: real sandbox, real operator, one replay runtime per leader pod."""

from __future__ import annotations

import base64
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_operator.sandbox.testing import wait_for
from operator_harness import MOED, OperatorProcess, bind_model_volume

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
REFRESH_S = 10


def moed(namespace: str, name: str = "") -> str:
    return f"{MOED}/namespaces/{namespace}/moedeployments" + (f"/{name}" if name else "")


@pytest.fixture()
def deployed(api: httpx.Client, namespace: str, moe_operator: OperatorProcess) -> Iterator[str]:
    bind_model_volume(api, namespace, "models")
    yield namespace
    for item in api.get(moed(namespace)).json()["items"]:
        api.delete(moed(namespace, item["metadata"]["name"]))


def replay(ip: str, token_file: Path, log: Path) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "moe_runtime.cli", "replay", "--host", ip, "--port", "9400",
        "--model", "deepseek-v3", "--gpus", "16", "--gpus-per-node", "4", "--redundant", "16",
        "--rebalance-iterations", "40", "--pass-interval", "0.01", "--tokens-per-pass", "1024",
        "--planner", "off", "--token-file", str(token_file), "--role", "decode",
    ]  # fmt: skip
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def runtime_balancedness(ip: str) -> float | None:
    try:
        text = httpx.get(f"http://{ip}:9400/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^moe_runtime_balancedness ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def held_version(ip: str) -> int | None:
    try:
        body: dict[str, Any] = httpx.get(f"http://{ip}:9400/v1/placement", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    v = body.get("version")
    return int(v) if v is not None else None


def test_control_loop_balances_two_instances(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
    name = obj["metadata"]["name"]
    obj["spec"].pop("prefill")
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"].update(
        {"redundantExperts": 16, "refreshInterval": f"{REFRESH_S}s", "minInterval": f"{REFRESH_S}s",
         "history": "2m", "minImprovement": 0.02}
    )  # fmt: skip
    assert api.post(moed(deployed), json=obj).status_code == 201, "spec refused"
    pods_path = f"/api/v1/namespaces/{deployed}/pods"
    selector = f"moe.inference.dev/deployment={name},apps.kubernetes.io/pod-index=0"

    def leaders() -> list[str] | None:
        items = api.get(pods_path, params={"labelSelector": selector}).json()["items"]
        ips = sorted(p["status"].get("podIP") or "" for p in items)
        return ips if len(ips) == 2 and all(ips) else None

    ips: list[str] = wait_for(leaders, 120, interval=0.5, what="two leader pods with IPs")
    secret = api.get(f"/api/v1/namespaces/{deployed}/secrets/{name}-runtime-token").json()
    token_file = tmp_path / "token"
    token_file.write_bytes(base64.b64decode(secret["data"]["token"]))
    procs = [replay(ip, token_file, tmp_path / f"replay-{i}.log") for i, ip in enumerate(ips)]
    timeline: list[str] = []
    start = time.monotonic()

    def placement() -> dict[str, Any]:
        st = api.get(moed(deployed, name)).json().get("status") or {}
        out: dict[str, Any] = (st.get("placement") or {}).get("decode") or {}
        return out

    def sample() -> tuple[dict[str, Any], list[float | None]]:
        p, bal = placement(), [runtime_balancedness(ip) for ip in ips]
        timeline.append(
            f"t={time.monotonic() - start:5.1f}s v={p.get('version', 0)} runtime={bal} "
            f"operator measured={p.get('measuredBalancedness')} predicted={p.get('predictedBalancedness')}"
        )
        return p, bal

    try:
        wait_for(lambda: all(b is not None for b in sample()[1]), 30, what="runtime metrics")

        def balanced() -> bool:
            p, bal = sample()
            pred = p.get("predictedBalancedness")
            measured = p.get("measuredBalancedness") or 0.0
            return bool(
                pred
                and p.get("version", 0) >= 1
                and measured >= 0.9 * pred
                and all(b and b >= 0.9 * pred for b in bal)
            )

        # Two refreshes after creation have passed by now at most; allow three more plus slack.
        wait_for(balanced, 3 * REFRESH_S + 30, interval=2, what="balancedness near the prediction")
        v1 = placement()["version"]

        # One runtime dies: the other keeps getting the placement refreshed and stays balanced.
        procs[1].send_signal(signal.SIGTERM)
        procs[1].wait(10)
        wait_for(lambda: "unreachable" in placement().get("message", ""), 3 * REFRESH_S, interval=2)
        _, bal = sample()
        assert bal[0] is not None and bal[0] >= 0.9 * placement()["predictedBalancedness"]
        assert (held_version(ips[0]) or 0) >= v1

        # The operator restarts: versions continue (no reset to 0 or 1), history is the ConfigMap's.
        moe_operator.restart()
        time.sleep(REFRESH_S + 6)
        after = placement()
        assert after["version"] >= v1, after
        cm = api.get(f"/api/v1/namespaces/{deployed}/configmaps/{name}-decode-placement").json()
        assert int(cm["metadata"]["annotations"]["moe.inference.dev/placement-version"]) >= v1
        sample()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)
        print(
            "\nbalancedness timeline (runtime: SGLang balancedness of the applied map on the newest window):"
        )
        print("\n".join(timeline))
