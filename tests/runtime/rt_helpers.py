"""Shared helpers of the runtime tests (imported as rt_helpers): ports, waits, skips."""

from __future__ import annotations

import http.server
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_ports import free_port as free_port  # re-exported: the runtime tests import it from here
from local_ports import free_ports
from process_output import follow

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
FAKE_ENGINE = Path(__file__).parent / "fake_engine"


def require_sglang() -> None:
    """Skip (with the reason) when torch or the real sglang package cannot be imported."""
    for name in ("torch", "sglang.srt.eplb.eplb_algorithms", "sglang.srt.plugins.hook_registry"):
        try:
            importlib.import_module(name)
        except Exception as exc:
            pytest.skip(
                f"{name} not importable ({type(exc).__name__}: {exc}); "
                "create the runtime venv with `bash runtime/scripts/setup-test-env.sh` and run "
                "`.venv-runtime/bin/pytest -m runtime tests/runtime`"
            )


@dataclass
class Server:
    """A server process of a test, its ports, and everything it printed (drained as it runs, so
    a chatty process never blocks on a full pipe)."""

    proc: subprocess.Popen[str]
    ports: list[int]
    lines: list[str] = field(default_factory=list)

    def output(self, tail: int = 4000) -> str:
        return "".join(self.lines)[-tail:]

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def start_server(
    command: Callable[[list[int]], list[str]],
    ports: int,
    ready: Callable[[list[int]], Any],
    timeout: float = 30.0,
    attempts: int = 3,
) -> Server:
    """Start ``command(ports)`` on ``ports`` fresh ports and wait until ``ready(ports)``.

    A port picked free can be taken by someone else (an outgoing connection of the sandbox's
    components) before the server binds it; a server that exits saying so is started again on
    other ports. Any other exit, or no readiness in ``timeout``, fails with what it printed."""
    for attempt in range(attempts):
        picked = free_ports(ports)
        argv = command(picked)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        server = Server(proc, picked)
        drain = follow(proc, server.lines)
        up, exited = False, None
        try:
            up = _wait_ready(server, ready, timeout)
            exited = proc.poll()  # None: still running, not ready in time
        finally:
            if not up:
                server.stop()
                drain.join(timeout=5)
        if up:
            return server
        if (
            exited is not None
            and "address already in use" in server.output().lower()
            and attempt + 1 < attempts
        ):
            continue
        what = f"exited with {exited}" if exited is not None else f"was not ready in {timeout:.0f} s"
        raise AssertionError(f"{' '.join(argv[:4])} ... {what}; it printed:\n{server.output()}")
    raise AssertionError("unreachable: the last attempt returns or raises")


def _wait_ready(server: Server, ready: Callable[[list[int]], Any], timeout: float) -> bool:
    """Until ``ready`` answers or the process exits (tests run one at a time, so no other
    server of ours answers on a picked port meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:
            if ready(server.ports):
                return True
        except Exception:  # connection refused while starting, ...
            pass
        time.sleep(0.05)
    return False


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # connection refused while starting, ...
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or predicate}: last={last!r}")


def runtime_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "moe_runtime.cli", *args]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        runtime_cmd(*args), capture_output=True, text=True, env=full_env, timeout=timeout, check=False
    )


def metric(text: str, name: str, **labels: str) -> float | None:
    """Value of one sample in Prometheus text, or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


class StubWorkerHandler(http.server.BaseHTTPRequestHandler):
    """A worker as sglang-router sees it while registering one: every GET answers the model info.
    Subclasses answer the generations (do_POST) with ``answer``."""

    def answer(self, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self.answer({"model_path": "stub", "is_generation": True, "dp_size": 1})

    def log_message(self, *_: object) -> None:
        pass


def router_ready(proc: subprocess.Popen[bytes], base: str, log: Path) -> Callable[[], bool]:
    """A wait_for predicate: the router at ``base`` answers /readiness 200; fails at once, with its
    log, if the process has exited."""

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            return httpx.get(f"{base}/readiness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
