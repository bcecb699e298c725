"""The replay engine end to end (main venv, no torch): it serves the sidecar API, and a
placement pushed to it changes the measured balancedness of the replayed traffic."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from rt_helpers import free_port, metric, runtime_cmd, wait_for

from moe_runtime.replay.baseline import deepseek_global

TOKEN = "replay-token"
LAYERS, DENSE, EXPERTS, GPUS, REDUNDANT = 4, 1, 16, 4, 4
SLOTS = EXPERTS + REDUNDANT


@pytest.fixture
def replay(tmp_path: Path) -> Iterator[tuple[httpx.Client, subprocess.Popen[str]]]:
    (tmp_path / "token").write_text(TOKEN)
    port = free_port()
    cmd = runtime_cmd(
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
        "--port", str(port),
        "--state-dir", str(tmp_path / "state"),
        "--token-file", str(tmp_path / "token"),
        "--poll-interval", "0.05",
        "--planner", "off",
        "--seed", "3",
    )  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        wait_for(lambda: client.get("/healthz").status_code == 200, what="replay API")
        yield client, proc
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode not in (0, -signal.SIGTERM):
            print(proc.stdout.read() if proc.stdout else "")


def scrape(client: httpx.Client) -> str:
    return client.get("/metrics").text


def sglang_balancedness(client: httpx.Client) -> tuple[float, float]:
    text = scrape(client)
    s = metric(text, "sglang:eplb_balancedness_sum", forward_mode="decode")
    c = metric(text, "sglang:eplb_balancedness_count", forward_mode="decode")
    assert s is not None and c is not None
    return s, c


def measure(client: httpx.Client, passes: int = 120) -> float:
    """Mean balancedness SGLang-style over the next `passes` replayed passes."""
    s0, c0 = sglang_balancedness(client)
    wait_for(lambda: sglang_balancedness(client)[1] >= c0 + passes, timeout=60, what="passes")
    s1, c1 = sglang_balancedness(client)
    return (s1 - s0) / (c1 - c0)


def loads(client: httpx.Client) -> np.ndarray:
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


def push(client: httpx.Client, version: int, m: np.ndarray) -> dict[str, Any]:
    r = client.put(
        "/v1/placement",
        json={"version": version, "physical_to_logical_map": m.tolist()},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def applied_version(client: httpx.Client) -> float | None:
    return metric(scrape(client), "moe_runtime_placement_applied_version")


def test_replay_serves_the_sidecar_api(replay: tuple[httpx.Client, subprocess.Popen[str]]) -> None:
    client, _ = replay
    wait_for(lambda: client.get("/readyz").status_code == 200, what="ready")
    assert client.get("/health").status_code == 200
    wait_for(lambda: client.get("/v1/windows").json()["windows"], what="a window")
    w = client.get("/v1/windows/latest").json()
    assert (w["num_layers"], w["num_experts"]) == (LAYERS, EXPERTS)
    assert w["passes"] == 40 and w["tokens"] > 0 and sum(w["counts"][0]) == 0  # dense layer
    st = client.get("/v1/status").json()
    assert st["engine"] == {"ready": True, "reason": "engine process running", "draining": False}
    assert st["plugin"]["decisions"].get("original", 0) >= 1
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
    assert client.put("/v1/placement", json={}).status_code == 401


def test_pushed_placement_changes_measured_balancedness(
    replay: tuple[httpx.Client, subprocess.Popen[str]],
) -> None:
    client, _ = replay
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
    cfg.write_text(
        '{"modelPath": "deepseek-ai/DeepSeek-V3", "role": "prefill",'
        ' "parallel": {"nnodes": 1, "gpusPerNode": 8},'
        ' "eplb": {"numRedundantExperts": 8, "rebalanceIterations": 20},'
        ' "model": {"numLayers": 5, "numExperts": 32, "topK": 4}}'
    )
    port = free_port()
    proc = subprocess.Popen(
        runtime_cmd("replay", "--engine-config", str(cfg), "--port", str(port), "--pass-interval", "0.005",
                    "--state-dir", str(tmp_path / "s"), "--poll-interval", "0.05", "--planner", "off"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ},
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            wait_for(lambda: c.get("/v1/windows").json()["windows"], what="a window")
            st = c.get("/v1/status").json()
            assert st["role"] == "prefill" and st["model"] == "deepseek-ai/DeepSeek-V3"
            assert st["layout"] == {
                "num_layers": 5, "num_experts": 32, "num_redundant": 8, "num_gpus": 8, "top_k": 4, "dispatch": "static"
            }  # fmt: skip
            assert metric(c.get("/metrics").text, "sglang:eplb_balancedness_count", forward_mode="extend")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


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
    replay: tuple[httpx.Client, subprocess.Popen[str]],
) -> None:
    client, _ = replay
    assert client.post("/v1/replay/shift", json={}).status_code == 401
    wait_for(lambda: len(client.get("/v1/windows").json()["windows"]) >= 3, timeout=60, what="3 windows")
    push(client, 1, deepseek_global(loads(client), GPUS, REDUNDANT))
    wait_for(lambda: applied_version(client) == 1, timeout=60, what="v1 applied at a rebalance")
    fitted = measure(client)

    r = client.post("/v1/replay/shift", json={"seed": 11}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["seed"] == 11, r.text
    wait_for(lambda: client.get("/v1/replay").json()["shifts"] == 1, what="the shift applied")
    stale = measure(client)
    print(f"fitted map: balancedness {fitted:.3f}; after the shift: {stale:.3f}")
    # the pushed map stays (operator placements win over the engine's own EPLB) but no longer fits
    assert applied_version(client) == 1
    assert stale < fitted - 0.05, (fitted, stale)
