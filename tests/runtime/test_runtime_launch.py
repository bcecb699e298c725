"""`moe-runtime launch` end to end with a fake `sglang.launch_server` (main venv).

Checks supervision: sidecar up with the engine, readiness from the engine's /health,
SIGTERM -> not ready -> SIGTERM to the engine -> exit with the engine's status; a
SIGTERM-ignoring engine is killed after the grace period; an engine that dies on its own
takes the pod down with its exit status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from rt_helpers import FAKE_ENGINE, free_port, runtime_cmd, wait_for


def start(
    tmp: Path, engine_env: dict[str, str], **cfg_over: Any
) -> tuple[subprocess.Popen[str], httpx.Client, dict[str, Any]]:
    http, sidecar = free_port(), free_port()
    cfg = {
        "modelPath": "/models/fake",
        "role": "decode",
        "parallel": {"nnodes": 1, "gpusPerNode": 8},
        "eplb": {"numRedundantExperts": 8, "placementFile": str(tmp / "placement.json")},
        "model": {"numLayers": 4, "numExperts": 16, "topK": 2},
        "ports": {"http": http, "sidecar": sidecar},
        "env": {"EXTRA_FOR_ENGINE": "1"},
        "drainSeconds": 0.5,
        "graceSeconds": 2,
        **cfg_over,
    }
    (tmp / "engine.json").write_text(json.dumps(cfg))
    (tmp / "token").write_text("t")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_", "LWS_"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(FAKE_ENGINE), env.get("PYTHONPATH", "")]),
            "MOE_ENGINE_CONFIG": str(tmp / "engine.json"),
            "MOE_RUNTIME_STATE_DIR": str(tmp / "state"),
            "MOE_RUNTIME_TOKEN_FILE": str(tmp / "token"),
            "MOE_SIDECAR_HOST": "127.0.0.1",
            "MOE_INSTANCE": "fake-0",
            "POD_IP": "127.0.0.1",
            "FAKE_RECORD": str(tmp / "record.json"),
            "FAKE_TERM_MARKER": str(tmp / "terminated"),
            **engine_env,
        }
    )
    proc = subprocess.Popen(
        runtime_cmd("launch"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{sidecar}", timeout=5)
    return proc, client, cfg


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_sigterm_drains_then_stops_the_engine_and_propagates_its_status(tmp_path: Path) -> None:
    proc, client, cfg = start(tmp_path, {"FAKE_EXIT_CODE": "7"})
    try:
        wait_for(lambda: client.get("/readyz").status_code == 200, what="engine ready via sidecar")
        rec = json.loads((tmp_path / "record.json").read_text())
        argv = rec["argv"]
        assert argv[argv.index("--port") + 1] == str(cfg["ports"]["http"])
        assert rec["env"]["MOE_EPLB_MODE"] == "operator"
        assert rec["env"]["MOE_RUNTIME_STATE_DIR"] == str(tmp_path / "state")
        assert rec["env"]["SGLANG_HOST_IP"] == "127.0.0.1"
        assert rec["env"]["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"].startswith(str(tmp_path / "state"))
        proc.send_signal(signal.SIGTERM)
        # drain: not ready before the engine hears about it
        r = wait_for(
            lambda: client.get("/readyz").status_code == 503 and client.get("/readyz"),
            timeout=5,
            what="not ready",
        )
        assert r.json()["reason"] == "draining"
        assert not (tmp_path / "terminated").exists()
        code, out = finish(proc)
        assert code == 7, out
        assert (tmp_path / "terminated").exists()
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()


def test_engine_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    proc, client, _ = start(tmp_path, {"FAKE_IGNORE_TERM": "1"})
    try:
        wait_for(lambda: client.get("/readyz").status_code == 200, what="ready")
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
        assert code == 128 + signal.SIGKILL, out  # SIGKILLed after drain + grace
        assert "ignored SIGTERM" in out
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()


def test_engine_crash_ends_the_pod_with_its_status(tmp_path: Path) -> None:
    proc, client, _ = start(tmp_path, {"FAKE_EXIT_AFTER": "1.5", "FAKE_EXIT_CODE": "3"})
    try:
        code, out = finish(proc)
        assert code == 3, out
    finally:
        client.close()


def test_launch_mounts_the_persisted_placement(tmp_path: Path) -> None:
    from moe_placement.maps import trivial_map

    m = trivial_map(4, 16, 24)
    (tmp_path / "placement.json").write_text(
        json.dumps({"version": 4, "generatedAt": "2026-01-01T00:00:00Z", "physicalToLogicalMap": m.tolist()})
    )
    proc, client, _ = start(tmp_path, {})
    try:
        wait_for(lambda: client.get("/readyz").status_code == 200, what="ready")
        argv = json.loads((tmp_path / "record.json").read_text())["argv"]
        init = Path(argv[argv.index("--init-expert-location") + 1])
        assert json.loads(init.read_text()) == {"physical_to_logical_map": m.tolist()}
        st = client.get("/v1/status").json()
        assert st["placement"]["applied"]["source"] == "init" and st["placement"]["applied"]["version"] == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)
        client.close()


@pytest.mark.parametrize("rank", ["1"])
def test_non_leader_ranks_are_ready_while_the_engine_runs(tmp_path: Path, rank: str) -> None:
    proc, client, _ = start(
        tmp_path,
        {"MOE_RANK": rank, "MOE_LEADER_ADDRESS": "leader.example", "MOE_NNODES": "2"},
        parallel={"nnodes": 2, "gpusPerNode": 8},
        eplb={"numRedundantExperts": 16},
    )
    try:
        r = wait_for(lambda: client.get("/readyz").status_code == 200 and client.get("/readyz"), what="ready")
        assert r.json()["reason"] == "engine process running"
        argv = json.loads((tmp_path / "record.json").read_text())["argv"]
        assert argv[argv.index("--node-rank") + 1] == "1"
        assert argv[argv.index("--dist-init-addr") + 1] == "leader.example:20102"
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)
        client.close()
