"""The replay engine end to end (main venv, no torch): it serves the sidecar API, and a
placement pushed to it changes the measured balancedness of the replayed traffic."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from rt_helpers import Server, metric, runtime_cmd, start_server, wait_for

from moe_placement.maps import trivial_map
from moe_runtime.replay.baseline import deepseek_global

TOKEN = "replay-token"
LAYERS, DENSE, EXPERTS, GPUS, REDUNDANT = 4, 1, 16, 4, 4
SLOTS = EXPERTS + REDUNDANT


@dataclass
class Replay:
    api: httpx.Client  # the API port (reads are open in replay unless --reads token)
    probes: httpx.Client
    sidecar_metrics: httpx.Client
    engine: httpx.Client  # the stand-in SGLang's HTTP port
    server: Server

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.api.get(path, **kw)


def start_replay(tmp_path: Path, *extra: str) -> Replay:
    (tmp_path / "token").write_text(TOKEN)

    def command(ports: list[int]) -> list[str]:
        return runtime_cmd(
            "replay",
            "--model", "tiny",
            "--layers", str(LAYERS),
            "--dense-layers", str(DENSE),
            "--experts", str(EXPERTS),
            "--gpus", str(GPUS),
            "--gpus-per-node", "2",
            "--redundant", str(REDUNDANT),
            "--rebalance-iterations", "40",
            "--pass-interval", "0.002",
            "--port", str(ports[0]),
            "--probe-port", str(ports[1]),
            "--metrics-port", str(ports[2]),
            "--engine-port", str(ports[3]),
            "--state-dir", str(tmp_path / "state"),
            "--token-file", str(tmp_path / "token"),
            "--poll-interval", "0.05",
            "--recorder-interval", "0.2",
            "--planner", "off",
            "--seed", "3",
            *extra,
        )  # fmt: skip

    def healthy(ports: list[int]) -> bool:
        return httpx.get(f"http://127.0.0.1:{ports[1]}/healthz", timeout=2).status_code == 200

    server = start_server(command, 4, healthy)
    clients = [httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=10) for p in server.ports]
    return Replay(clients[0], clients[1], clients[2], clients[3], server)


def stop_replay(r: Replay) -> None:
    for c in (r.api, r.probes, r.sidecar_metrics, r.engine):
        c.close()
    if r.server.stop() not in (0, -signal.SIGTERM):
        print(r.server.output())


@pytest.fixture
def replay(tmp_path: Path) -> Iterator[Replay]:
    r = start_replay(tmp_path)
    try:
        yield r
    finally:
        stop_replay(r)


def scrape(client: Replay) -> str:
    """Both /metrics of the pod: SGLang's (engine port) and the sidecar's (metrics port)."""
    return client.engine.get("/metrics").text + client.sidecar_metrics.get("/metrics").text


def sglang_balancedness(client: Replay) -> tuple[float, float]:
    text = scrape(client)
    s = metric(text, "sglang:eplb_balancedness_sum", forward_mode="decode")
    c = metric(text, "sglang:eplb_balancedness_count", forward_mode="decode")
    assert s is not None and c is not None
    return s, c


def measure(client: Replay, passes: int = 120) -> float:
    """Mean balancedness SGLang-style over the next `passes` replayed passes."""
    s0, c0 = sglang_balancedness(client)
    wait_for(lambda: sglang_balancedness(client)[1] >= c0 + passes, timeout=60, what="passes")
    s1, c1 = sglang_balancedness(client)
    return (s1 - s0) / (c1 - c0)


def loads(client: Replay) -> np.ndarray:
    wins = client.get("/v1/windows").json()["windows"]
    return np.sum([w["counts"] for w in wins[-5:]], axis=0)


def hot_on_one_gpu(load: np.ndarray) -> np.ndarray:
    """A valid but bad map: each layer's hottest experts share GPU 0, cold ones get the copies."""
    per_gpu = SLOTS // GPUS
    rows = []
    for layer in load:
        order = np.argsort(-layer, kind="stable")
        rows.append(np.concatenate([order, order[-REDUNDANT:]]))  # GPU 0 = slots 0..per_gpu-1 = hottest
    out = np.stack(rows).astype(np.int64)
    assert out.shape == (LAYERS, SLOTS) and per_gpu == 5
    return out


def push(client: Replay, version: int, m: np.ndarray) -> dict[str, Any]:
    r = client.api.put(
        "/v1/placement",
        json={"version": version, "physical_to_logical_map": m.tolist()},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def applied_version(client: Replay) -> float | None:
    return metric(scrape(client), "moe_runtime_placement_applied_version")


def test_replay_serves_the_sidecar_api(replay: Replay) -> None:
    client = replay
    wait_for(lambda: client.probes.get("/readyz").status_code == 200, what="ready")
    assert client.engine.get("/health").status_code == 200
    assert client.engine.get("/ready").status_code == 200
    wait_for(lambda: client.get("/v1/windows").json()["windows"], what="a window")
    w = client.get("/v1/windows/latest").json()
    assert (w["num_layers"], w["num_experts"]) == (LAYERS, EXPERTS)
    assert w["passes"] == 40 and w["tokens"] > 0 and sum(w["counts"][0]) == 0  # dense layer
    # 32 of the window's 40 passes, read off the recorder's ring as the plugin reads SGLang's
    sampled = client.get("/v1/windows/latest", params={"steps": "true"}).json()
    assert w["step_samples"] == 32 and sampled["seq"] == w["seq"]
    steps = np.asarray(sampled["steps"])
    assert steps.shape == (32, LAYERS, EXPERTS) and steps[:, 0].sum() == 0
    assert (steps.sum(axis=0) <= np.asarray(sampled["counts"])).all() and (steps.sum(axis=(1, 2)) > 0).all()
    st = client.get("/v1/status").json()
    assert st["engine"] == {"ready": True, "reason": "engine ready", "draining": False}
    # the hook writes its counters and the window separately; the sidecar reads both at its polls
    wait_for(lambda: client.get("/v1/status").json()["plugin"]["decisions"].get("original", 0) >= 1,
             what="the plugin's decisions in /v1/status")  # fmt: skip
    text = scrape(client)
    for name in (
        "sglang:eplb_balancedness_count",
        "sglang:num_running_reqs",
        "sglang:gen_throughput",
        "moe_runtime_balancedness",
        "moe_runtime_layer_balancedness",
        "moe_runtime_hottest_expert_share",
        "moe_runtime_forward_passes_total",
        "moe_runtime_tokens_total",
        "moe_runtime_placement_version",
        "moe_runtime_plugin_errors_total",
    ):
        assert name in text, name
    assert client.api.put("/v1/placement", json={}).status_code == 401
    rep = client.get("/v1/replay").json()
    # operator mode: SGLang's EPLB takes the recorder's window at every rebalance; no dump
    assert rep["rebalances"] >= 1 and rep["recorder"] == {"recording": True, "dumps": 0}


def test_pushed_placement_changes_measured_balancedness(
    replay: Replay,
) -> None:
    client = replay
    wait_for(lambda: len(client.get("/v1/windows").json()["windows"]) >= 3, timeout=60, what="3 windows")
    load = loads(client)

    push(client, 1, hot_on_one_gpu(load))
    wait_for(lambda: applied_version(client) == 1, timeout=60, what="v1 applied at a rebalance")
    bad = measure(client)
    bad_sidecar = metric(scrape(client), "moe_runtime_balancedness")
    print(f"bad map: balancedness {bad:.3f} (sidecar {bad_sidecar})")

    push(client, 2, deepseek_global(loads(client), GPUS, REDUNDANT))
    wait_for(lambda: applied_version(client) == 2, timeout=60, what="v2 applied at a rebalance")
    good = measure(client)
    good_sidecar = metric(scrape(client), "moe_runtime_balancedness")
    print(f"balanced map: balancedness {good:.3f} (sidecar {good_sidecar})")

    # SGLang's formula averages over all layers (the dense one counts 1.0); the hot-GPU map is
    # far worse on the replayed traffic, the balanced one close to perfect
    assert good > bad + 0.15, (bad, good)
    assert good > 0.8, good
    assert bad_sidecar is not None and good_sidecar is not None and good_sidecar > bad_sidecar + 0.15
    st = client.get("/v1/status").json()
    assert st["placement"]["applied"]["source"] == "operator" and st["placement"]["version"] == 2
    assert st["plugin"]["decisions"]["operator"] >= 2


def test_replay_with_engine_config(tmp_path: Path) -> None:
    """The e2e harness starts replay with the same EngineConfig the operator renders."""
    cfg = tmp_path / "engine.json"

    def command(ports: list[int]) -> list[str]:
        http, sidecar, probes, scrape_port = ports
        cfg.write_text(
            '{"modelPath": "deepseek-ai/DeepSeek-V3", "role": "prefill",'
            ' "parallel": {"nnodes": 1, "gpusPerNode": 8},'
            ' "eplb": {"numRedundantExperts": 8, "rebalanceIterations": 20},'
            ' "model": {"numLayers": 5, "numExperts": 32, "topK": 4},'
            f' "ports": {{"http": {http}, "sidecar": {sidecar}}}}}'
        )
        return runtime_cmd("replay", "--engine-config", str(cfg), "--pass-interval", "0.005",
                           "--probe-port", str(probes), "--metrics-port", str(scrape_port),
                           "--state-dir", str(tmp_path / "s"), "--poll-interval", "0.05", "--planner", "off")  # fmt: skip

    server = start_server(
        command, 4, lambda p: httpx.get(f"http://127.0.0.1:{p[2]}/healthz").status_code == 200
    )
    http, sidecar = server.ports[:2]
    try:
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{sidecar}", timeout=10) as c,
            httpx.Client(base_url=f"http://127.0.0.1:{http}", timeout=10) as engine,
        ):
            wait_for(lambda: c.get("/v1/windows").json()["windows"], what="a window")
            st = c.get("/v1/status").json()
            assert st["role"] == "prefill" and st["model"] == "deepseek-ai/DeepSeek-V3"
            assert st["layout"] == {
                "num_layers": 5, "num_experts": 32, "num_redundant": 8, "num_gpus": 8, "top_k": 4, "dispatch": "static"
            }  # fmt: skip
            assert metric(
                engine.get("/metrics").text, "sglang:eplb_balancedness_count", forward_mode="extend"
            )
    finally:
        server.stop()


def test_static_mode_never_rebalances_and_windows_come_from_recorder_dumps(tmp_path: Path) -> None:
    """SGLang without --enable-eplb: no rebalance_experts call, the sidecar dumps the recorder."""
    m = np.stack(
        [np.random.default_rng(i).permutation(trivial_map(1, EXPERTS, SLOTS)[0]) for i in range(LAYERS)]
    )
    (tmp_path / "placement.json").write_text(json.dumps(
        {"version": 4, "generatedAt": "2026-01-01T00:00:00Z", "physicalToLogicalMap": m.tolist()}
    ))  # fmt: skip
    r = start_replay(tmp_path, "--eplb-mode", "static", "--placement-file", str(tmp_path / "placement.json"))
    try:
        wait_for(lambda: len(r.get("/v1/windows").json()["windows"]) >= 3, timeout=60, what="3 windows")
        rep = r.get("/v1/replay").json()
        assert rep["mode"] == "static" and rep["rebalances"] == 0 and rep["last_decision"] is None
        assert rep["recorder"]["recording"] and rep["recorder"]["dumps"] >= 3
        st = r.get("/v1/status").json()
        assert st["load_source"] == "recorder" and st["plugin"] == {}  # the hook never ran
        # booted with the persisted placement, as the launcher's --init-expert-location does
        assert st["placement"]["applied"] == {**st["placement"]["applied"], "source": "init", "version": 4}
        w = r.get("/v1/windows/latest").json()
        assert w["placement"] == {"source": "init", "version": 4}
        assert 0 < w["passes"] <= 40 and sum(w["counts"][0]) == 0 and w["tokens"] > 0  # buffer: 40 passes
        # a push is held but never applied: there is no rebalance to apply it at
        push(r, 5, m)
        time.sleep(1.0)
        assert r.get("/v1/status").json()["placement"]["applied"]["version"] == 4
        assert metric(scrape(r), "moe_runtime_recorder_dumps_total", result="ok")
    finally:
        stop_replay(r)


def test_off_mode_has_no_rebalance_no_recorder_and_no_windows(tmp_path: Path) -> None:
    r = start_replay(tmp_path, "--eplb-mode", "off")
    try:
        wait_for(lambda: r.get("/v1/replay").json()["passes"] > 200, what="passes")
        rep = r.get("/v1/replay").json()
        assert rep["rebalances"] == 0 and rep["recorder"] is None
        assert r.get("/v1/windows").json()["windows"] == []
        dump = r.engine.post("/dump_expert_distribution_record")
        assert dump.status_code == 500 and "expert_distribution_recorder_mode" in dump.text
    finally:
        stop_replay(r)


def test_engine_mode_rebalances_with_sglangs_algorithm(tmp_path: Path) -> None:
    r = start_replay(tmp_path, "--eplb-mode", "engine")
    try:
        wait_for(lambda: r.get("/v1/replay").json()["rebalances"] >= 2, timeout=60, what="rebalances")
        rep = r.get("/v1/replay").json()
        assert rep["last_decision"]["source"] == "original" and rep["recorder"]["dumps"] == 0
        # the hook's counters reach the sidecar through plugin-status.json, a poll later
        wait_for(lambda: r.get("/v1/status").json()["plugin"]["decisions"]["original"] >= 2,
                 what="the plugin's decisions in /v1/status")  # fmt: skip
        wait_for(lambda: r.get("/v1/windows").json()["windows"], what="windows exported by the hook")
    finally:
        stop_replay(r)


def test_reads_can_require_the_token_as_launch_does(tmp_path: Path) -> None:
    r = start_replay(tmp_path, "--reads", "token")
    try:
        assert r.get("/v1/windows").status_code == 401
        assert r.get("/v1/replay").status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert r.get("/v1/windows", headers=auth).status_code == 200
        assert r.probes.get("/readyz").status_code in (200, 503)
    finally:
        stop_replay(r)


def test_offered_load_raises_latency(tmp_path: Path) -> None:
    r = start_replay(tmp_path, "--request-rate", "2")
    try:

        def p95(name: str) -> float | None:
            text = r.engine.get("/metrics").text
            return quantile(text, name, 0.95)

        wait_for(lambda: p95("sglang:inter_token_latency_seconds") is not None, what="ITL samples")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert r.api.post("/v1/replay/load", json={"requestRate": 40}).status_code == 401
        for bad in ({"requestRate": -1}, {"requestRate": "fast"}, {"rate": 3}, {"requestRate": 1e9}):
            assert r.api.post("/v1/replay/load", json=bad, headers=auth).status_code == 400, bad
        before = r.engine.get("/metrics").text
        assert r.api.post("/v1/replay/load", json={"requestRate": 40}, headers=auth).status_code == 200
        base_ttft = quantile(before, "sglang:time_to_first_token_seconds", 0.95)
        base_itl = quantile(before, "sglang:inter_token_latency_seconds", 0.95)

        def slow() -> tuple[float, float] | None:
            # the batch fills first (a few seconds), then the queue grows: TTFT with it
            after = r.engine.get("/metrics").text
            ttft = quantile(after, "sglang:time_to_first_token_seconds", 0.95, since=before)
            itl = quantile(after, "sglang:inter_token_latency_seconds", 0.95, since=before)
            return (ttft, itl) if ttft and itl and ttft > 2.0 and itl > 0.1 else None

        ttft, itl = wait_for(slow, timeout=60, interval=1, what="p95 TTFT > 2 s and ITL > 0.1 s")
        print(f"p95 TTFT {base_ttft} -> {ttft}, p95 ITL {base_itl} -> {itl}")
        assert base_ttft is not None and base_ttft < 0.5 and base_itl is not None and base_itl < 0.06
        assert r.get("/v1/replay").json()["load"]["queued"] > 0
    finally:
        stop_replay(r)


def quantile(text: str, family: str, q: float, since: str | None = None) -> float | None:
    """histogram_quantile over every label set of a family (minus the counts of ``since``)."""
    from prometheus_client.parser import text_string_to_metric_families

    def buckets(t: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for fam in text_string_to_metric_families(t):
            for s in fam.samples:
                if s.name == family + "_bucket":
                    le = float(s.labels["le"])
                    out[le] = out.get(le, 0.0) + s.value
        return out

    now = buckets(text)
    old = buckets(since) if since else {}
    cum = sorted((le, now[le] - old.get(le, 0.0)) for le in now)
    if not cum or cum[-1][1] <= 0:
        return None
    rank = q * cum[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in cum:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-9)
        prev_le, prev_c = le, c
    return None


def test_trace_shift_moves_hot_experts_and_keeps_the_skew() -> None:
    from moe_runtime.replay.trace import StreamingTrace, TraceConfig

    trace = StreamingTrace(TraceConfig(num_layers=3, num_experts=EXPERTS, top_k=2, seed=5))
    before = trace.popularity.copy()
    trace.shift(7)
    after = trace.popularity
    # the same distributions per layer, on other experts
    np.testing.assert_allclose(np.sort(after, axis=-1), np.sort(before, axis=-1))
    assert (after.argmax(axis=-1) != before.argmax(axis=-1)).any()


def test_shift_endpoint_makes_a_fitted_placement_stale(
    replay: Replay,
) -> None:
    client = replay
    assert client.api.post("/v1/replay/shift", json={}).status_code == 401
    wait_for(lambda: len(client.get("/v1/windows").json()["windows"]) >= 3, timeout=60, what="3 windows")
    push(client, 1, deepseek_global(loads(client), GPUS, REDUNDANT))
    wait_for(lambda: applied_version(client) == 1, timeout=60, what="v1 applied at a rebalance")
    fitted = measure(client)

    r = client.api.post("/v1/replay/shift", json={"seed": 11}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["seed"] == 11, r.text
    wait_for(lambda: client.get("/v1/replay").json()["shifts"] == 1, what="the shift applied")
    stale = measure(client)
    print(f"fitted map: balancedness {fitted:.3f}; after the shift: {stale:.3f}")
    # the pushed map stays (operator placements win over the engine's own EPLB) but no longer fits
    assert applied_version(client) == 1
    assert stale < fitted - 0.05, (fitted, stale)
