"""The real sglang-router 0.3.2, started with the command the operator renders, health-checks its
workers with SGLang's cheap /ready (`--health-check-endpoint /ready`), not the default /health:
SGLang 0.5.23's /health generates a token, 1-20 s under load, beyond the router's 5 s check
timeout, so a busy worker would be marked unhealthy and dropped.

The worker is a stub HTTP server on loopback that records the paths it is asked for. The router
asks /health once while it registers a worker (its connection-mode detection ignores the flag),
then /server_info and /model_info, then only the configured endpoint.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rt_helpers import free_port, require_sglang, router_ready, stop_process, wait_for

from moe_operator.render.group import Owner
from moe_operator.render.shared import router_objects
from render_cases import gb200_decode_spec

pytestmark = pytest.mark.runtime


class Worker(http.server.ThreadingHTTPServer):
    paths: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Worker

    def do_GET(self) -> None:
        self.server.paths.append(self.path.split("?", 1)[0])
        body = json.dumps({"model_path": "stub", "is_generation": True, "dp_size": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture()
def worker() -> Iterator[Worker]:
    server = Worker(("127.0.0.1", 0), _Handler)
    server.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def rendered_router_argv(worker_url: str, port: int, metrics: int) -> list[str]:
    """The rendered router command, its workers replaced by ``worker_url``, listening on loopback."""
    objects = router_objects(gb200_decode_spec(), Owner("m", "inference", "uid"))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    argv: list[str] = list(container["command"][1:])
    start = argv.index("--worker-urls") + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    argv[start:end] = [worker_url]
    moved = {"--host": "127.0.0.1", "--port": str(port), "--prometheus-port": str(metrics)}
    return [moved.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]


def test_router_checks_workers_with_ready_not_the_generating_health(worker: Worker, tmp_path: Path) -> None:
    require_sglang()
    port, metrics = free_port(), free_port()
    argv = rendered_router_argv(f"http://127.0.0.1:{worker.server_address[1]}", port, metrics)
    assert argv[argv.index("--health-check-endpoint") + 1] == "/ready"
    # Checks every second instead of every 60 s, so that several happen within the test.
    argv += ["--health-check-interval-secs", "1"]
    log = (tmp_path / "router.log").open("w")
    proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            router_ready(proc, base, tmp_path / "router.log"), 60, what="router ready with the stub worker"
        )
        seen = len(worker.paths)
        wait_for(lambda: worker.paths[seen:].count("/ready") >= 3, 30, what="three periodic checks")
    finally:
        stop_process(proc)
    # Once checks start, they are all /ready; /health only came before, while registering.
    first = worker.paths.index("/ready")
    assert set(worker.paths[first:]) == {"/ready"}, worker.paths
    assert set(worker.paths[:first]) <= {"/health", "/server_info", "/model_info"}, worker.paths
