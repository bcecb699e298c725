"""A P/D router listing one decode instance starts: held against the real sglang-router 0.3.2.

The decode policy is power_of_two (it picks the less loaded of two), which sglang-router refuses
at start-up over fewer than two workers ("Power-of-two policy for decode requires at least 2
decode workers"). The rendered list is shorter than spec.decode.replicas while a pool is scaled
in or has an instance off the list for its roll, so the policy must follow the list, not the
spec: otherwise every new router pod of that roll exits, the roll stalls with the old pods
serving the old list, and the drained instance is removed under them at drainTimeout.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rt_helpers import StubWorkerHandler, free_port, router_ready, stop_process, wait_for

from moe_operator.render.group import Owner
from moe_operator.render.shared import router_objects
from render_cases import example_spec

pytestmark = pytest.mark.runtime


@pytest.fixture()
def workers() -> Iterator[dict[str, str]]:
    """A stub worker per role (the router refuses one URL registered twice)."""
    servers = {
        role: http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubWorkerHandler)
        for role in ("--prefill", "--decode")
    }
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {role: f"http://127.0.0.1:{server.server_address[1]}" for role, server in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def _argv(
    serving: dict[str, int], off: dict[str, int], workers: dict[str, str], port: int, metrics: int
) -> list[str]:
    """The rendered P/D router command, each listed instance pointed at its role's stub worker, on loopback."""
    spec = example_spec("deepseek-v3-pd-h100.yaml")
    assert spec.prefill is not None and spec.decode.replicas >= 2
    objects = router_objects(spec, Owner("m", "inference", "uid"), serving, off)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    argv: list[str] = list(container["command"][1:])
    moved = {"--host": "127.0.0.1", "--port": str(port), "--prometheus-port": str(metrics)}
    out = [moved.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    return [workers.get(out[i - 1], a) if i else a for i, a in enumerate(out)]


@pytest.mark.parametrize(
    ("serving", "off"),
    [({"decode": 1}, {}), ({}, {"decode": 1})],
    ids=["scaled-in-to-one", "one-off-the-list-of-two"],
)
def test_a_pd_router_listing_one_decode_instance_starts(
    workers: dict[str, str], serving: dict[str, int], off: dict[str, int], tmp_path: Path
) -> None:
    pytest.importorskip("sglang_router", reason="the runtime venv (runtime/scripts/setup-test-env.sh) has it")
    port, metrics = free_port(), free_port()
    argv = _argv(serving, off, workers, port, metrics)
    assert argv.count("--decode") == 1 and argv.count("--prefill") == 1
    assert argv[argv.index("--decode-policy") + 1] == "round_robin"
    log = tmp_path / "router.log"
    proc = subprocess.Popen([sys.executable, *argv], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(
            router_ready(proc, f"http://127.0.0.1:{port}", log),
            60,
            what="the P/D router listing one decode instance ready",
        )
        time.sleep(1.0)
        assert proc.poll() is None, log.read_text()[-4000:]
    finally:
        stop_process(proc)
