"""The real sglang-router 0.3.2, started with the command the operator renders, finishes a request
in flight after SIGTERM: what a router pod replaced by a worker-list change does in the window its
pod spec gives it (a preStop wait, then the router's own graceful shutdown inside
terminationGracePeriodSeconds; render/shared.router_objects). Until this test, that behaviour was
read only from the binary's log strings.

The worker is a stub HTTP server on loopback that answers the router's registration and takes
DELAY_S to answer a generation; the router gets SIGTERM while one is in flight.
"""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rt_helpers import StubWorkerHandler, free_port, wait_for
from test_router_health_check import rendered_router_argv

from moe_operator.render.group import Owner
from moe_operator.render.shared import ROUTER_PRESTOP_S, router_objects, router_shutdown_grace_s
from render_cases import gb200_decode_spec

pytestmark = pytest.mark.runtime

DELAY_S = 4.0


class SlowWorker(http.server.ThreadingHTTPServer):
    generating: threading.Event


class _Handler(StubWorkerHandler):
    server: SlowWorker

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.generating.set()
        time.sleep(DELAY_S)
        self.answer({"text": "finished", "meta_info": {"id": "r1", "finish_reason": {"type": "stop"}}})


@pytest.fixture()
def worker() -> Iterator[SlowWorker]:
    server = SlowWorker(("127.0.0.1", 0), _Handler)
    server.generating = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_the_pod_spec_outlasts_the_wait_and_the_routers_own_grace() -> None:
    spec = gb200_decode_spec()
    (deployment,) = [o for o in router_objects(spec, Owner("m", "ns", "uid")) if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > ROUTER_PRESTOP_S + router_shutdown_grace_s(spec)


def test_a_router_told_to_stop_finishes_the_request_it_runs(worker: SlowWorker, tmp_path: Path) -> None:
    port, metrics = free_port(), free_port()
    argv = rendered_router_argv(f"http://127.0.0.1:{worker.server_address[1]}", port, metrics)
    log_path = tmp_path / "router.log"
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            r = httpx.post(f"{base}/generate", json={"text": "hi", "sampling_params": {}}, timeout=60)
            answer.update(status=r.status_code, body=r.text)
        except httpx.HTTPError as exc:
            answer.update(error=repr(exc))

    try:

        def ready() -> bool:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                return httpx.get(f"{base}/readiness", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, what="router ready with the stub worker")
        asking = threading.Thread(target=ask)
        asking.start()
        assert worker.generating.wait(20), log_path.read_text()[-4000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        asking.join(60)
        assert answer.get("status") == 200 and "finished" in answer.get("body", ""), (
            answer,
            log_path.read_text()[-4000:],
        )
        assert time.monotonic() - sent < DELAY_S + 10  # answered when the worker did, not at a timeout
        proc.wait(30)  # and then it stops by itself, well inside its grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log_path.read_text()
    assert "graceful shutdown" in text.lower(), text[-4000:]
