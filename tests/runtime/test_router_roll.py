"""A scale-in's router roll, counted at the real sglang-router 0.3.2: no request fails.

Taking an instance off the list rolls the router Deployment (the list is its command line). Here
the roll runs with the rendered router command and two stub workers on loopback, in the order
Kubernetes and the operator give it:
1. the new router pod (the list without worker 1) starts and turns ready: from here the
   Deployment's replicas, updated and ready counts call the roll done;
2. the old pod is deleted: the Service's endpoints drop it after a propagation lag, and the
   kubelet runs its preStop wait (ROUTER_PRESTOP_S), then SIGTERM: sglang-router finishes what
   it holds and exits;
3. the operator removes worker 1 only once no router pod is terminating (router_settled).
Clients send generations all along through "the Service" (the routers its endpoints list).
What is emulated: the Service, its lag and the kubelet's steps; the routers are real processes.
Step 3's order is the test's own, the one router_settled holds the operator to (its units and the
scale-in e2e test that): this test shows what the real router does under it. The old router
still sends to worker 1 after step 1, so removing it there (what the Deployment's counts alone
allowed) would cut requests; the test asserts that it did.
"""

from __future__ import annotations

import http.server
import itertools
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rt_helpers import StubWorkerHandler, free_port, wait_for
from test_router_health_check import rendered_router_argv

from moe_operator.render.shared import ROUTER_PRESTOP_S

pytestmark = pytest.mark.runtime

DELAY_S = 0.5  # each generation
CLIENTS = 6
ENDPOINTS_LAG_S = 1.5  # the Service still sends to a deleted pod this long (within the preStop wait)


class Worker(http.server.ThreadingHTTPServer):
    served: list[float]  # when each generation was answered


class _Handler(StubWorkerHandler):
    server: Worker

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(DELAY_S)
        self.server.served.append(time.monotonic())
        self.answer({"text": "done", "meta_info": {"id": "r", "finish_reason": {"type": "stop"}}})


@pytest.fixture()
def workers() -> Iterator[list[Worker]]:
    out = []
    for _ in range(2):
        server = Worker(("127.0.0.1", 0), _Handler)
        server.served = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        out.append(server)
    yield out
    for server in out:
        server.shutdown()
        server.server_close()


def _url(worker: Worker) -> str:
    return f"http://127.0.0.1:{worker.server_address[1]}"


class RouterPod:
    """A router process started with the rendered command, its list replaced by ``urls``."""

    def __init__(self, urls: list[str], log: Path) -> None:
        self.port, metrics = free_port(), free_port()
        argv = rendered_router_argv(urls[0], self.port, metrics)
        at = argv.index("--worker-urls") + 1
        argv[at : at + 1] = urls
        self.log = log
        self.proc = subprocess.Popen([sys.executable, *argv], stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-4000:]
        try:
            return httpx.get(f"{self.base}/readiness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Service:
    """Round robin over the router pods its endpoints list; clients that count every answer."""

    def __init__(self, pods: list[RouterPod]) -> None:
        self.endpoints, self.turn = pods, itertools.count()
        self.answers: list[tuple[float, int | str]] = []
        self.stopping = threading.Event()

    def client(self) -> None:
        with httpx.Client(timeout=60) as http:
            while not self.stopping.is_set():
                pods = self.endpoints
                pod = pods[next(self.turn) % len(pods)]
                body = {"text": f"prompt {uuid.uuid4()}", "sampling_params": {"max_new_tokens": 4}}
                try:
                    outcome: int | str = http.post(f"{pod.base}/generate", json=body).status_code
                except httpx.HTTPError as exc:
                    outcome = repr(exc)
                self.answers.append((time.monotonic(), outcome))


def test_a_scale_in_roll_fails_no_request_at_the_router(workers: list[Worker], tmp_path: Path) -> None:
    pytest.importorskip("sglang_router", reason="the runtime venv (runtime/scripts/setup-test-env.sh) has it")
    w0, w1 = workers
    old = RouterPod([_url(w0), _url(w1)], tmp_path / "old.log")
    new: RouterPod | None = None
    service = Service([old])
    clients = [threading.Thread(target=service.client) for _ in range(CLIENTS)]
    try:
        wait_for(old.ready, 60, what="the router listing two workers ready")
        for c in clients:
            c.start()
        wait_for(lambda: len(w0.served) >= 3 and len(w1.served) >= 3, 30, what="both workers serving")
        # 1. the new pod, the list without worker 1: the Deployment's counts call the roll done
        new = RouterPod([_url(w0)], tmp_path / "new.log")
        wait_for(new.ready, 60, what="the router listing one worker ready")
        rolled = time.monotonic()
        service.endpoints = [old, new]  # ready: the Service's endpoints take it
        # 2. the old pod deleted: endpoints drop it after a lag; preStop wait, then SIGTERM
        threading.Timer(ENDPOINTS_LAG_S, lambda: setattr(service, "endpoints", [new])).start()
        time.sleep(ROUTER_PRESTOP_S)
        old.proc.send_signal(signal.SIGTERM)
        assert old.proc.wait(60) == 0, old.log.read_text()[-4000:]
        # 3. no router pod terminating: worker 1 goes
        gone = time.monotonic()
        w1.shutdown()
        w1.server_close()
        time.sleep(2)
    finally:
        service.stopping.set()
        for c in clients:
            if c.is_alive():
                c.join(70)
        old.stop()
        if new is not None:
            new.stop()
    failed = [(round(t - rolled, 2), o) for t, o in service.answers if o != 200]
    assert not failed, (failed, old.log.read_text()[-3000:])
    late = [t for t in w1.served if t > rolled]
    assert late, "the old router sent worker 1 nothing after the new one was ready: the test shows nothing"
    assert max(late) <= gone
    assert any(t > gone for t, _ in service.answers)  # the load went on after worker 1 was removed
