"""The demo's Prometheus pieces, against the real promtool: generated config, shortened rules, episodes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e" / "demo"))

from demo_prometheus import RuntimeTarget, episodes, identity, scrape_config, shorten_for  # noqa: E402

RULES = ROOT / "policies" / "prometheus" / "moe-alerts.rules.yaml"
ALERT = "MoEExpertImbalanceHigh"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run e2e/setup.sh (installs the Debian package prometheus)"
    return path


def demo_rules(tmp_path: Path) -> Path:
    rules, changed = shorten_for(yaml.safe_load(RULES.read_text()), "10s")
    shipped = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert len(changed) == len(shipped) and all(c.endswith("-> 10s") for c in changed)
    out = tmp_path / "demo.rules.yaml"
    out.write_text(yaml.safe_dump(rules, sort_keys=False))
    return out


def test_shortened_rules_keep_expressions_and_change_only_for(tmp_path: Path) -> None:
    shipped = yaml.safe_load(RULES.read_text())
    short = yaml.safe_load(demo_rules(tmp_path).read_text())
    for g_old, g_new in zip(shipped["groups"], short["groups"], strict=True):
        for old, new in zip(g_old["rules"], g_new["rules"], strict=True):
            assert new["for"] == "10s"
            assert {k: v for k, v in new.items() if k != "for"} == {
                k: v for k, v in old.items() if k != "for"
            }


def test_shortened_imbalance_alert_fires_and_resolves_in_seconds(tmp_path: Path) -> None:
    """What the demo relies on: 0.55 for a while fires within 10s-ish, 0.9 afterwards resolves it."""
    rules = demo_rules(tmp_path)
    labels = 'namespace="default",deployment="deepseek-v3",pool="decode"'
    rule = next(
        r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"] if r.get("alert") == ALERT
    )
    annotations = {
        k: v.replace("{{ $labels.namespace }}", "default")
        .replace("{{ $labels.deployment }}", "deepseek-v3")
        .replace("{{ $labels.pool }}", "decode")
        .replace('{{ $value | printf "%.2f" }}', "0.55")
        for k, v in rule["annotations"].items()
    }
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [
                    {"series": f'moe_runtime_balancedness{{{labels},pod="a"}}', "values": "0.5x8 0.9x8"},
                    {"series": f'moe_runtime_balancedness{{{labels},pod="b"}}', "values": "0.6x8 0.8x8"},
                ],
                "alert_rule_test": [
                    {"eval_time": "5s", "alertname": ALERT, "exp_alerts": []},
                    {
                        "eval_time": "15s",
                        "alertname": ALERT,
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "default",
                                    "deployment": "deepseek-v3",
                                    "pool": "decode",
                                },
                                "exp_annotations": annotations,
                            }
                        ],
                    },
                    {"eval_time": "50s", "alertname": ALERT, "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "demo.test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool(), "test", "rules", "demo.test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_config_passes_promtool_and_labels_runtimes(tmp_path: Path) -> None:
    rules = demo_rules(tmp_path)
    targets = [
        RuntimeTarget("default", "deepseek-v3", "decode", "deepseek-v3-decode-0-0", "127.134.0.1"),
        RuntimeTarget("default", "deepseek-v3", "prefill", "deepseek-v3-prefill-0-0", "127.134.0.10"),
    ]
    config = scrape_config(targets, "127.0.0.1:34100", str(rules), 5)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    labels = {
        "namespace": "default",
        "deployment": "deepseek-v3",
        "pool": "decode",
        "pod": "deepseek-v3-decode-0-0",
    }
    runtime_job, engine_job, operator_job = config["scrape_configs"]
    # the runtime's metrics listener and SGLang's HTTP port, as the PodMonitors scrape them
    assert runtime_job["static_configs"][0] == {"targets": ["127.134.0.1:9402"], "labels": labels}
    assert engine_job["static_configs"][0] == {"targets": ["127.134.0.1:30000"], "labels": labels}
    assert len(runtime_job["static_configs"]) == len(engine_job["static_configs"]) == 2
    assert operator_job["static_configs"] == [{"targets": ["127.0.0.1:34100"]}]


def test_episodes_split_on_gaps_and_tell_resolved_from_still_firing() -> None:
    def series(pool: str, times: list[float]) -> dict[str, Any]:
        metric = {
            "__name__": "ALERTS",
            "alertname": "MoEExpertImbalanceHigh",
            "alertstate": "firing",
            "pool": pool,
        }
        return {"metric": metric, "values": [[t, "1"] for t in times]}

    matrix = [
        series("decode", [100, 105, 110, 140, 145]),
        series("prefill", [120, 125, 190, 195, 200]),
        series("router", [150]),
    ]
    firing_now = {("MoEExpertImbalanceHigh", identity(matrix[1]["metric"]))}
    eps = episodes(matrix, step_s=5, firing_now=firing_now)
    got = [(e.label("pool"), e.fired_at, e.last_seen, e.resolved) for e in eps]
    assert got == [
        ("decode", 100, 110, True),
        ("prefill", 120, 125, True),
        ("decode", 140, 145, True),
        ("router", 150, 150, True),
        ("prefill", 190, 200, False),
    ]
    assert eps[0].alert == "MoEExpertImbalanceHigh"
