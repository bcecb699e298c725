"""A replay runtime's SGLang /metrics, scraped, against SGLang 0.5.23's metric catalog.

The catalog (policies/prometheus/sglang-0.5.23.metrics.yaml) is read from the real wheel
(tools/sglang_metrics.py); tests/policies/sglang_series.family_of maps a series to its
family. Every sglang:* sample a replay exports must exist there with the catalog's type,
label names (per variant: dp_rank under attention DP) and `le` strings, without `_created`
samples, and the roles must export what SGLang's do: TTFT (with is_streaming) and ITL
(without) on decode and standalone servers, neither on prefill, num_requests_total everywhere.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rt_helpers import REPO, runtime_cmd, start_server, wait_for

sys.path.insert(0, str(REPO / "tests" / "policies"))
from sglang_series import catalog, family_of

from moe_runtime.replay.sglang_metrics import BUCKETS

CASES = {
    # name: (role, ep, attention DP, catalog variant)
    "decode-attention-dp": ("decode", 8, 8, "attention-dp"),
    "standalone-ep": ("standalone", 8, 1, "ep"),
    "prefill-plain": ("prefill", 1, 1, "plain"),
}


def engine_config(role: str, ep: int, dp: int, http: int, sidecar: int) -> dict[str, Any]:
    return {
        "modelPath": "/models/m",
        "servedModelName": "m",
        "role": role,
        "parallel": {"nnodes": 1, "gpusPerNode": 8, "attnDp": dp, "a2aBackend": "deepep" if ep > 1 else "none"},
        "eplb": {"mode": "operator" if ep > 1 else "off", "numRedundantExperts": 8 if ep > 1 else 0,
                 "rebalanceIterations": 20},
        "model": {"numLayers": 4, "numExperts": 16, "topK": 2},
        "ports": {"http": http, "sidecar": sidecar},
    }  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CASES))
def exposition(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    name = request.param
    role, ep, dp, _ = CASES[name]
    tmp = tmp_path_factory.mktemp(name)

    def command(ports: list[int]) -> list[str]:
        http, sidecar, probes, scrape = ports
        (tmp / "engine.json").write_text(json.dumps(engine_config(role, ep, dp, http, sidecar)))
        return runtime_cmd("replay", "--engine-config", str(tmp / "engine.json"), "--state-dir", str(tmp / "s"),
                           "--probe-port", str(probes), "--metrics-port", str(scrape),
                           "--pass-interval", "0.005", "--request-rate", "20", "--planner", "off")  # fmt: skip

    server = start_server(
        command, 4, lambda p: httpx.get(f"http://127.0.0.1:{p[2]}/healthz").status_code == 200
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.ports[0]}", timeout=10) as engine:

            def finished() -> str | None:
                text = engine.get("/metrics").text
                return text if "sglang:num_requests_total{" in text and "sglang:e2e_request" in text else None

            wait_for(finished, timeout=60, interval=0.5, what="finished requests")
            if role != "prefill":
                wait_for(lambda: 'is_streaming="false",le=' in engine.get("/metrics").text, timeout=30)
            yield name, engine.get("/metrics").text
    finally:
        server.stop()


def samples(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """(sample name, family type, labels) of every sglang:* sample."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("sglang:"):
                out.append((s.name, fam.type, dict(s.labels)))
    return out


def test_every_sample_is_a_catalog_series_with_its_labels_and_buckets(exposition: tuple[str, str]) -> None:
    name, text = exposition
    variant = CASES[name][3]
    assert "_created" not in text.replace("moe_runtime", "")  # multiprocess mode: never any
    seen = samples(text)
    assert seen, text
    for series, kind, labels in seen:
        fam = family_of(series)
        assert fam is not None, f"{series} is not a series SGLang 0.5.23 exports"
        assert kind == fam["type"], (series, kind, fam["type"])
        assert variant in fam.get("variants", [variant]), f"{series} does not exist in variant {variant}"
        expected = fam.get("labels_by_variant", {}).get(variant, fam["labels"])
        got = sorted(k for k in labels if k != "le" and k != "quantile")
        assert got == sorted(expected), (series, got, expected)
        if series.endswith("_bucket"):
            assert labels["le"] in fam["buckets"], (series, labels["le"])
    # the replay's bucket bounds are the catalog's, in order
    fams = {f["name"]: f for f in catalog()["families"]}
    assert list(BUCKETS["ttft"]) == fams["sglang:time_to_first_token_seconds"]["buckets"]
    assert list(BUCKETS["itl"]) == fams["sglang:inter_token_latency_seconds"]["buckets"]
    assert list(BUCKETS["e2e"]) == fams["sglang:e2e_request_latency_seconds"]["buckets"]


def test_each_role_exports_what_sglang_observes_there(exposition: tuple[str, str]) -> None:
    name, text = exposition
    role, ep, dp, _ = CASES[name]
    names = {s for s, _, _ in samples(text)}
    by_name: dict[str, list[dict[str, str]]] = {}
    for s, _, labels in samples(text):
        by_name.setdefault(s, []).append(labels)
    assert "sglang:num_requests_total" in names
    assert {lab["is_streaming"] for lab in by_name["sglang:num_requests_total"]} <= {"true", "false"}
    for gauge in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
    ):
        ranks = by_name[gauge]
        if dp > 1:  # one series per attention-DP group's stats rank, with dp_rank
            assert sorted(int(lab["dp_rank"]) for lab in ranks) == list(range(dp)), gauge
        else:
            assert len(ranks) == 1 and ranks[0]["tp_rank"] == "0" and "dp_rank" not in ranks[0]
    ttft = "sglang:time_to_first_token_seconds_bucket"
    itl = "sglang:inter_token_latency_seconds_bucket"
    if role == "prefill":
        assert ttft not in names and itl not in names  # P/D prefill servers observe neither
    else:
        assert {lab["is_streaming"] for lab in by_name[ttft]} == {"true", "false"}
        assert all("is_streaming" not in lab for lab in by_name[itl])
    balance = [lab for s, _, lab in samples(text) if s.startswith("sglang:eplb_balancedness")]
    if ep > 1:  # reported on the first rank only
        assert balance and all(lab["tp_rank"] == "0" for lab in balance)
        assert all(lab.get("dp_rank", "0") == "0" for lab in balance)
    else:
        assert not balance
