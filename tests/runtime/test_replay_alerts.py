"""The shipped latency alerts against series the replay engine produces, in promtool.

tests/policies/moe-alerts.test.yaml checks the rules on hand-written series shaped as SGLang
exports them; here the series are the replay's own exposition (replay/sglang_metrics.py over
replay/load.py), scraped once a minute on a simulated clock for 30 minutes: a decode and a
P/D prefill instance at 2 requests/s, then from minute 15 at 16 requests/s (twice a decode
instance's capacity). Scrapes carry the label contract the PodMonitor adds (namespace,
deployment, pool, pod). promtool evaluates policies/prometheus/moe-alerts.rules.yaml as
shipped: nothing fires under the calm load; after the step plus the rules' 5m window and
10m `for`, MoETimeToFirstTokenHigh and MoEInterTokenLatencyHigh fire for the decode pool and
for nothing else (a prefill server observes neither histogram, as in SGLang).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rt_helpers import REPO

from moe_runtime.replay.load import LoadConfig, LoadModel, Role
from moe_runtime.replay.sglang_metrics import BUCKETS, EngineLabels, SGLangMetrics

RULES = REPO / "policies" / "prometheus" / "moe-alerts.rules.yaml"
LATENCY = ("MoETimeToFirstTokenHigh", "MoEInterTokenLatencyHigh")
MINUTES, STEP_AT = 30, 15
FAMILIES = ("sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket")


class Instance:
    def __init__(self, pool: str, role: Role, seed: int) -> None:
        self.pool, self.pod = pool, f"d-{pool}-0-0"
        self.registry = CollectorRegistry()
        self.load = LoadModel(LoadConfig(request_rate=2.0, seed=seed), role, BUCKETS, now=0.0)
        engine_type = "prefill" if role == "prefill" else "decode"
        labels = EngineLabels("deepseek-ai/DeepSeek-V3", engine_type, tp_size=8, attn_dp=8, ep_size=8)
        SGLangMetrics(self.registry, labels, self.load)

    def scrape(self) -> dict[str, float]:
        """This minute's samples of the latency histograms, as Prometheus stores them."""
        target = {"namespace": "ns", "deployment": "d", "pool": self.pool, "pod": self.pod,
                  "job": "ns/d", "instance": f"{self.pod}:30000"}  # fmt: skip
        out = {}
        for fam in text_string_to_metric_families(generate_latest(self.registry).decode()):
            for s in fam.samples:
                if s.name in FAMILIES:
                    labels = {**s.labels, **target}
                    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    out[f"{s.name}{{{inner}}}"] = s.value
        return out


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run e2e/setup.sh (installs the Debian package prometheus)"
    return path


def series() -> list[dict[str, str]]:
    instances = [Instance("decode", "decode", 1), Instance("prefill", "prefill", 2)]
    samples: list[dict[str, float]] = []
    for minute in range(MINUTES + 1):
        if minute == STEP_AT:
            for inst in instances:
                inst.load.set_rate(16.0)
        if minute:
            for inst in instances:
                inst.load.advance(60.0 * minute)
        samples.append({k: v for inst in instances for k, v in inst.scrape().items()})
    names = sorted({k for s in samples for k in s})
    assert any('pool="decode"' in n and "time_to_first" in n for n in names)
    assert not any('pool="prefill"' in n for n in names), "a prefill server observes neither histogram"
    return [{"series": n, "values": " ".join(repr(s[n]) if n in s else "_" for s in samples)} for n in names]


def firing(at: str, expected: list[str]) -> dict[str, Any]:
    return {
        "expr": f'count by (alertname, pool, alertstate) (ALERTS{{alertname=~"{"|".join(LATENCY)}"}})',
        "eval_time": at,
        "exp_samples": [
            {"labels": f'{{alertname="{a}",alertstate="firing",pool="decode"}}', "value": 1} for a in expected
        ],
    }


def test_the_shipped_latency_alerts_fire_on_replay_series_when_load_rises(tmp_path: Path) -> None:
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(),
                "promql_expr_test": [
                    firing(f"{STEP_AT - 1}m", []),  # calm: nothing pending or firing
                    firing(f"{MINUTES}m", list(LATENCY)),  # only these two, only for decode
                ],
            }
        ],
    }
    path = tmp_path / "replay-latency.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run(
        [promtool(), "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "SUCCESS" in result.stdout
