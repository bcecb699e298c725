"""Chaos: a runtime refuses placement pushes. The operator must keep that runtime's old placement,
count and report the refusal, leave everything else alone, and recover once pushes work again."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_moe import (
    Recovery,
    engine_pods,
    events,
    get_moed,
    identity,
    is_ready,
    metric,
    moed_path,
    qwen3,
    wait_ready,
)
from e2e_target import Target

from moe_contract.auth import DIGESTS_FILE, digests_document
from moe_sandbox.testing import wait_for
from operator_harness import pod_instance, runtime_credentials, start_replay

pytestmark = pytest.mark.cluster

REFRESH_S = 10
SIDECAR = 9400
METRICS = 9402  # the runtime's metrics listener (no token, as Prometheus scrapes it)


def _held(ip: str) -> int | None:
    try:
        v = httpx.get(f"http://{ip}:{SIDECAR}/v1/placement", timeout=10).json().get("version")
    except (httpx.HTTPError, ValueError):
        return None
    return int(v) if v is not None else None


def _placement(api: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    st = get_moed(api, namespace, name).get("status") or {}
    out: dict[str, Any] = (st.get("placement") or {}).get("decode") or {}
    return out


@pytest.mark.sandbox_only("serves replay runtimes on the simulated pods' loopback IPs")
def test_refused_push_keeps_old_placement_and_says_so(
    api: httpx.Client, deployed: str, target: Target, recovery: Recovery, tmp_path: Path
) -> None:
    _, operator = target.require_sandbox()
    obj = qwen3(
        2, refreshInterval=f"{REFRESH_S}s", minInterval=f"{REFRESH_S}s", history="2m", minImprovement=0.02
    )
    name = obj["metadata"]["name"]
    assert api.post(moed_path(deployed), json=obj).status_code == 201
    wait_ready(api, deployed, name)
    leaders = sorted(
        engine_pods(api, deployed, name), key=lambda p: p["metadata"]["labels"]["moe.inference.dev/instance"]
    )
    assert len(leaders) == 2
    ips = [p["status"]["podIP"] for p in leaders]
    bad_pod = leaders[1]["metadata"]["name"]
    # What each engine pod mounts: the digests of the instances' tokens, in its own directory.
    tokens = [runtime_credentials(api, deployed, name, tmp_path / f"token-{i}")[0] for i in range(2)]
    digests = tokens[1].with_name(DIGESTS_FILE)
    mounted = digests.read_bytes()
    procs = [
        start_replay(
            ip,
            tokens[i],
            tmp_path / f"replay-{i}.log",
            instance=pod_instance(leaders[i]),
            model="qwen3-30b-a3b",
            gpus=8,
            gpus_per_node=8,
            redundant=8,
        )
        for i, ip in enumerate(ips)
    ]
    try:
        wait_for(
            lambda: all((_held(ip) or 0) >= 1 for ip in ips),
            9 * REFRESH_S,
            interval=1,
            what="both runtimes on v1+",
        )
        old = _held(ips[1])
        pods = identity(engine_pods(api, deployed, name))

        # Runtime 1 starts refusing every push (its digests no longer match the operator's key).
        digests.write_text(digests_document(b"not-the-operators-key-0123456789", [pod_instance(leaders[1])]))
        broke = time.monotonic()

        def reported() -> dict[str, Any] | None:
            p = _placement(api, deployed, name)
            msg = p.get("message", "")
            return p if "push refused" in msg and bad_pod in msg and "HTTP 401" in msg else None

        refused = wait_for(reported, 9 * REFRESH_S, interval=1, what="the refusal in status.placement")
        recovery.record("refusal reported in status.placement.decode", time.monotonic() - broke)
        # The refusing runtime keeps the placement it had; the other one has the operator's current one.
        # (a push already in flight when the digests changed may have landed, never a later one)
        kept = _held(ips[1])
        assert kept is not None and old is not None and old <= kept <= refused["version"], (old, kept)
        assert (_held(ips[0]) or 0) >= refused["version"]
        assert "1 of 2 runtime(s) hold it, push refused" in refused["message"], refused[
            "message"
        ]  # only runtime 1
        text = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
        labels = {"namespace": deployed, "deployment": name, "pool": "decode"}
        assert metric(text, "moe_operator_rebalance_failures_total", reason="push_refused", **labels) >= 1
        assert metric(text, "moe_operator_placement_pushes_total", result="http_401", **labels) >= 1
        runtime_text = httpx.get(f"http://{ips[1]}:{METRICS}/metrics", timeout=5).text
        assert metric(runtime_text, "moe_runtime_placement_pushes_total", result="unauthorized") >= 1
        # Nothing else changed: same engine pods, still Ready, no group restarts.
        assert identity(engine_pods(api, deployed, name)) == pods
        assert is_ready(get_moed(api, deployed, name))
        assert not events(api, deployed, "GroupRestarting")

        digests.write_bytes(mounted)
        fixed = time.monotonic()

        def recovered() -> bool:
            p = _placement(api, deployed, name)
            return "push refused" not in p.get("message", "") and _held(ips[1]) == p.get("version")

        wait_for(recovered, 9 * REFRESH_S, interval=1, what="runtime 1 accepting pushes again")
        recovery.record("runtime 1 holds the current placement again", time.monotonic() - fixed)
        assert identity(engine_pods(api, deployed, name)) == pods
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)
