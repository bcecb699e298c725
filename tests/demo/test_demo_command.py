"""The README's first command, `bash e2e/demo.sh`, end to end from this checkout, then `down`.

It runs its own sandbox (state dir under tmp_path, ports at MOE_TEST_PORT_BASE + 500), so it
coexists with the session sandbox and with a demo the user runs by hand.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from moe_sandbox.cluster import Ports, Sandbox
from moe_sandbox.testing import TEST_PORT_BASE

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
BASE = TEST_PORT_BASE + 500


def run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "e2e/demo.sh", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_demo_runs_rebalances_and_cleans_up(tmp_path: Path) -> None:
    state = tmp_path / "sandbox"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(MOE_SANDBOX_PORT_BASE=str(BASE), MOE_SANDBOX_DIR=str(state), PYTHONUNBUFFERED="1")
    demo_dir = state / "demo"
    try:
        result = run([], env, timeout=900)
        out = result.stdout + result.stderr
        (tmp_path / "demo.log").write_text(out)  # the whole run (pytest keeps the last tmp dirs)
        assert result.returncode == 0, out[-6000:]
        summary: dict[str, Any] = json.loads((demo_dir / "summary.json").read_text())

        # The control loop published at least one placement for each pool, in status and ConfigMaps.
        assert summary["versions"].keys() == {"prefill", "decode"}, summary
        assert min(summary["versions"].values()) >= 1, summary
        assert summary["placementConfigMaps"]["deepseek-v3-decode-placement"] >= 1, summary
        assert "Placement versions" in out and "decode   v" in out

        # Prometheus saw the imbalance alert fire on the trivial placement and resolve after the rebalance.
        # (decode: 0.49 trivial, ~0.85 after; prefill's placements sit nearer the 0.7 threshold.)
        decode = [
            a for a in summary["alerts"] if a["alert"] == "MoEExpertImbalanceHigh" and a["pool"] == "decode"
        ]
        assert decode and all(a["resolved"] for a in decode), summary["alerts"]
        assert "resolved at +" in out

        # Balancedness: below the alert threshold on the trivial placement, clearly higher after.
        bal = summary["balancedness"]
        assert bal["before"]["decode"] < 0.7, bal
        assert bal["after"]["decode"] > bal["before"]["decode"] + 0.05, bal
        assert bal["operatorPredicted"]["decode"] > bal["operatorMeasuredFirst"]["decode"], bal

        # The load step: SGLang-named latency series from the replay runtimes in Prometheus, the
        # decode pool's TTFT and inter-token-latency alerts firing once its offered load doubles.
        names = set(summary["sglangSeries"])
        assert {f"sglang:time_to_first_token_seconds_{s}" for s in ("bucket", "count", "sum")} <= names
        assert {"sglang:inter_token_latency_seconds_bucket", "sglang:num_requests_total"} <= names
        assert "sglang:num_running_reqs" in names
        fired = {a["alert"] for a in summary["alerts"] if a["pool"] == "decode"}
        assert {"MoETimeToFirstTokenHigh", "MoEInterTokenLatencyHigh"} <= fired, summary["alerts"]
        assert not any(
            a["pool"] == "prefill" and a["alert"].startswith("MoETimeToFirst") for a in summary["alerts"]
        )
        lat = summary["latency"]
        assert lat["before"]["ttft"]["decode"] < 2 and lat["fired"]["ttft"]["decode"] > 2, lat
        assert lat["before"]["itl"]["decode"] < 0.1 and lat["fired"]["itl"]["decode"] > 0.1, lat
        assert "load step" in out

        # Autoscaling: the second deployment's decode pool scaled out on the ITL breach and back in,
        # the leaving instance drained first, and no replay engine refused a request.
        scaling = summary["autoscaling"]
        reasons = [e.split(":", 1)[0] for e in scaling["events"]]
        assert "ScaledOut" in reasons and "ScaledIn" in reasons, scaling
        assert reasons.index("ScaledOut") < reasons.index("ScaledIn"), scaling
        assert "DrainTimedOut" not in reasons, scaling
        assert sum(scaling["dropped"].values()) == 0 and len(scaling["dropped"]) == 2, scaling
        assert "autoscaling" in out and "serving 2" in out

        pids = {p.stem: int(p.read_text()) for p in (demo_dir / "pids").glob("*.pid")}
        pids["operator"] = int((state / "operator.pid").read_text())
        assert len(pids) == 7, pids  # 3 + 2 replay runtimes, Prometheus, the operator
        runtimes = json.loads((demo_dir / "targets.json").read_text())
    finally:
        down = run(["down"], env, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr

    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    assert not any((demo_dir / "pids").glob("*.pid"))
    assert all(pid is None for pid in Sandbox(state, Ports(BASE)).running().values())
    ports = [("127.0.0.1", BASE + 90), ("127.0.0.1", BASE + 100), ("127.0.0.1", BASE + 80)]
    ports += [("127.0.0.1", p) for p in Ports(BASE).all().values()]
    ports += [(t["ip"], port) for t in runtimes for port in (9400, 9401, 9402, t["engine_port"])]
    assert [hp for hp in ports if listening(*hp)] == []
