"""`moe-runtime launch` end to end with a fake `sglang.launch_server` (main venv).

Checks supervision: sidecar up with the engine, readiness from the engine's /ready (rank 0)
or its placeholder /health (worker ranks, which hang or start late in some cases),
SIGTERM -> not ready -> SIGTERM to the engine -> exit with the engine's status; a
SIGTERM-ignoring engine is killed after the grace period; an engine that dies on its own
takes the pod down with its exit status; static mode reads windows from recorder dumps,
the online modes never dump.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from rt_helpers import FAKE_ENGINE, free_ports, runtime_cmd, wait_for

from process_output import follow


@dataclass
class Pod:
    proc: subprocess.Popen[str]
    probes: httpx.Client
    api: httpx.Client
    cfg: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None

    def ready(self) -> httpx.Response:
        return self.probes.get("/readyz")

    def output(self) -> str:
        """What the runtime and the engine printed so far (drained as it comes, so a chatty
        pod never blocks on a full pipe)."""
        return "".join(self.lines)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        """``wait_for`` while the pod runs; fails with what it printed and its exit status when
        the time is up or the pod exited (at once: an exited pod will not get there)."""
        try:
            return wait_for(lambda: self._running() and predicate(), timeout=timeout, what=what)
        except (AssertionError, _Exited) as exc:
            raise AssertionError(
                f"{exc}\nexit status: {self.proc.poll()}\npod output:\n{self.output()[-6000:]}"
            ) from None

    def _running(self) -> bool:
        if self.proc.poll() is not None:
            raise _Exited(f"the pod exited while waiting (status {self.proc.returncode})")
        return True

    def kill(self) -> None:
        """SIGKILL to the runtime and the engine it started (one process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        self.probes.close()
        self.api.close()


class _Exited(BaseException):
    """Raised through wait_for (which retries on Exception) when the pod has exited."""


def start(tmp: Path, engine_env: dict[str, str], **cfg_over: Any) -> Pod:
    http, sidecar, probes, scrape = free_ports(4)
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
            "MOE_RUNTIME_PROBE_PORT": str(probes),
            "MOE_RUNTIME_METRICS_PORT": str(scrape),
            "MOE_INSTANCE": "fake-0",
            "POD_IP": "127.0.0.1",
            "FAKE_RECORD": str(tmp / "record.json"),
            "FAKE_TERM_MARKER": str(tmp / "terminated"),
            "FAKE_CALLS": str(tmp / "calls"),
            **engine_env,
        }
    )
    proc = subprocess.Popen(
        runtime_cmd("launch"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: Pod.kill reaches the engine too
    )
    pod = Pod(
        proc,
        httpx.Client(base_url=f"http://127.0.0.1:{probes}", timeout=5),
        httpx.Client(
            base_url=f"http://127.0.0.1:{sidecar}", timeout=5, headers={"Authorization": "Bearer t"}
        ),
        cfg,
    )
    pod.drain = follow(proc, pod.lines)
    return pod


def finish(pod: Pod, timeout: float = 30) -> tuple[int, str]:
    """The pod's exit status and everything it printed; killed (engine included) past ``timeout``."""
    try:
        code = pod.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pod.kill()
        raise AssertionError(f"the pod did not exit in {timeout:.0f} s:\n{pod.output()[-6000:]}") from None
    if pod.drain is not None:
        pod.drain.join(timeout=5)
    return code, pod.output()


def test_sigterm_drains_then_stops_the_engine_and_propagates_its_status(tmp_path: Path) -> None:
    # room for the checks inside the drain, and for a loaded machine to run the engine's SIGTERM handler
    pod = start(tmp_path, {"FAKE_EXIT_CODE": "7"}, drainSeconds=10, graceSeconds=10)
    try:
        r = pod.wait(lambda: (r := pod.ready()).status_code == 200 and r, what="engine ready via sidecar")
        assert r.json()["reason"] == "engine ready"
        rec = json.loads((tmp_path / "record.json").read_text())
        argv = rec["argv"]
        assert argv[argv.index("--port") + 1] == str(pod.cfg["ports"]["http"])
        assert rec["env"]["MOE_EPLB_MODE"] == "operator"
        assert rec["env"]["MOE_RUNTIME_STATE_DIR"] == str(tmp_path / "state")
        assert rec["env"]["SGLANG_HOST_IP"] == "127.0.0.1"
        assert rec["env"]["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"].startswith(str(tmp_path / "state"))
        pod.proc.send_signal(signal.SIGTERM)
        # drain: not ready before the engine hears about it
        r = pod.wait(lambda: (r := pod.ready()).status_code == 503 and r, timeout=5, what="not ready")
        assert r.json()["reason"] == "draining"
        assert not (tmp_path / "terminated").exists()
        code, out = finish(pod)
        assert code == 7, out
        assert (tmp_path / "terminated").exists()
    finally:
        pod.close()
        if pod.proc.poll() is None:
            pod.kill()


def test_engine_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    pod = start(tmp_path, {"FAKE_IGNORE_TERM": "1"})
    try:
        pod.wait(lambda: pod.ready().status_code == 200, what="ready")
        pod.proc.send_signal(signal.SIGTERM)
        code, out = finish(pod)
        assert code == 128 + signal.SIGKILL, out  # SIGKILLed after drain + grace
        assert "ignored SIGTERM" in out
    finally:
        pod.close()
        if pod.proc.poll() is None:
            pod.kill()


def test_engine_crash_ends_the_pod_with_its_status(tmp_path: Path) -> None:
    pod = start(tmp_path, {"FAKE_EXIT_AFTER": "1.5", "FAKE_EXIT_CODE": "3"})
    try:
        code, out = finish(pod)
        assert code == 3, out
    finally:
        pod.close()


def test_launch_mounts_the_persisted_placement(tmp_path: Path) -> None:
    from moe_placement.maps import trivial_map

    m = trivial_map(4, 16, 24)
    (tmp_path / "placement.json").write_text(
        json.dumps({"version": 4, "generatedAt": "2026-01-01T00:00:00Z", "physicalToLogicalMap": m.tolist()})
    )
    pod = start(tmp_path, {})
    try:
        pod.wait(lambda: pod.ready().status_code == 200, what="ready")
        argv = json.loads((tmp_path / "record.json").read_text())["argv"]
        init = Path(argv[argv.index("--init-expert-location") + 1])
        assert json.loads(init.read_text()) == {"physical_to_logical_map": m.tolist()}
        st = pod.api.get("/v1/status").json()
        assert st["placement"]["applied"]["source"] == "init" and st["placement"]["applied"]["version"] == 4
    finally:
        pod.proc.send_signal(signal.SIGTERM)
        finish(pod)
        pod.close()


def test_worker_ranks_are_ready_when_their_placeholder_health_answers(tmp_path: Path) -> None:
    """node_rank >= 1: SGLang serves /health on --port once its schedulers are ready, and a hung
    rank stops answering it: the pod is unready before, ready then, unready while hung."""
    hang = tmp_path / "hang"
    pod = start(
        tmp_path,
        {"MOE_RANK": "1", "MOE_LEADER_ADDRESS": "leader.example", "MOE_NNODES": "2",
         "FAKE_READY_FILE": str(tmp_path / "schedulers-ready"), "FAKE_HANG_FILE": str(hang)},
        parallel={"nnodes": 2, "gpusPerNode": 8},
        eplb={"numRedundantExperts": 16},
    )  # fmt: skip
    try:
        r = pod.wait(
            lambda: (r := pod.ready()).status_code == 503 and "/health" in r.json()["reason"] and r,
            what="not ready while its schedulers start (nothing listens yet)",
        )
        (tmp_path / "schedulers-ready").touch()
        r = pod.wait(lambda: (r := pod.ready()).status_code == 200 and r, what="ready")
        assert r.json()["reason"] == "engine ready"
        argv = json.loads((tmp_path / "record.json").read_text())["argv"]
        assert argv[argv.index("--node-rank") + 1] == "1"
        assert argv[argv.index("--dist-init-addr") + 1] == "leader.example:20102"
        hang.touch()  # the rank hangs: its health check times out
        r = pod.wait(lambda: (r := pod.ready()).status_code == 503 and r, timeout=15, what="unready")
        assert "not answering" in r.json()["reason"]
        hang.unlink()
        pod.wait(lambda: pod.ready().status_code == 200, timeout=15, what="ready again")
        assert not (tmp_path / "calls").exists()  # a worker's sidecar never touches the recorder
    finally:
        hang.unlink(missing_ok=True)
        pod.proc.send_signal(signal.SIGTERM)
        finish(pod)
        pod.close()


def test_static_mode_windows_come_from_recorder_dumps(tmp_path: Path) -> None:
    pod = start(
        tmp_path,
        {"MOE_RUNTIME_RECORDER_INTERVAL_SECONDS": "0.2"},
        eplb={"mode": "static", "numRedundantExperts": 8},
    )
    try:
        pod.wait(lambda: pod.api.get("/v1/windows").json()["windows"], timeout=30, what="a window")
        argv = json.loads((tmp_path / "record.json").read_text())["argv"]
        assert "--enable-eplb" not in argv
        assert argv[argv.index("--expert-distribution-recorder-mode") + 1] == "stat"
        w = pod.api.get("/v1/windows/latest").json()
        assert w["passes"] == 5 and w["counts"][0] == [0] * 16 and w["counts"][1] == [15] * 16
        calls = (tmp_path / "calls").read_text().splitlines()
        assert calls[0] == "POST /start_expert_distribution_record"
        assert "POST /dump_expert_distribution_record" in calls
        assert pod.api.get("/v1/status").json()["load_source"] == "recorder"
    finally:
        pod.proc.send_signal(signal.SIGTERM)
        finish(pod)
        pod.close()


@pytest.mark.parametrize("mode", ["operator", "engine"])
def test_online_modes_never_dump_the_recorder(tmp_path: Path, mode: str) -> None:
    """A dump resets the recorder that in-engine EPLB reads: the sidecar must not steal its window."""
    pod = start(
        tmp_path,
        {"MOE_RUNTIME_RECORDER_INTERVAL_SECONDS": "0.1"},
        eplb={"mode": mode, "numRedundantExperts": 8},
    )
    try:
        pod.wait(lambda: pod.ready().status_code == 200, what="ready")
        time.sleep(1.0)
        assert not (tmp_path / "calls").exists()
        assert pod.api.get("/v1/status").json()["load_source"] == "rebalance hook"
    finally:
        pod.proc.send_signal(signal.SIGTERM)
        finish(pod)
        pod.close()
