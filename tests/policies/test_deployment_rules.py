"""A MoEDeployment's own PrometheusRule (spec.monitoring, render/monitoring.py) under promtool:
its groups, extracted from the rendered object, fire for that deployment only and with its own
minBalancedness and alertFor, on series shaped as SGLang 0.5.23, the sidecar and the operator
export them (the cluster-wide rule file's cases: moe-alerts.test.yaml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from sglang_series import histogram, scheduler_labels, series, target, tokenizer_labels

from moe_operator.api import MoEDeploymentSpec
from moe_operator.render.group import Owner
from moe_operator.render.monitoring import prometheus_rule
from render_cases import gb200_decode_spec

OWNER = Owner("d", "ns", "uid-1")
RUNBOOK = "https://github.com/moe-operator/moe-operator/blob/main/docs/alerts.md#"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run e2e/setup.sh (installs the Debian package prometheus)"
    return path


def spec(**monitoring: Any) -> MoEDeploymentSpec:
    data = gb200_decode_spec().model_dump(by_alias=True, exclude_none=True)
    data["monitoring"] = {**data["monitoring"], **monitoring}
    return MoEDeploymentSpec.model_validate(data)


def runtime(ns: str, dep: str, pool: str, pod: str) -> dict[str, str]:
    return {**target(ns, dep, pool, pod, "10.0.0.1", 9400), "endpoint": "runtime"}


def run(
    tmp_path: Path, rule: dict[str, Any], tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    check = subprocess.run(
        [promtool(), "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return subprocess.run(
        [promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )


def imbalance_case() -> dict[str, Any]:
    """0.8 is fine for the cluster-wide 0.7, not for this deployment's 0.85; others are not its business."""
    bal = "moe_runtime_balancedness"
    return {
        "name": "imbalance below minBalancedness for alertFor fires for this deployment only",
        "interval": "1m",
        "input_series": [
            {"series": series(bal, runtime("ns", "d", "decode", "d-decode-0-0")), "values": "0.8x30"},
            {"series": series(bal, runtime("ns", "d", "prefill", "d-prefill-0-0")), "values": "0.9x30"},
            {"series": series(bal, runtime("ns", "e", "decode", "e-decode-0-0")), "values": "0.3x30"},
            {"series": series(bal, runtime("other", "d", "decode", "d-decode-0-0")), "values": "0.3x30"},
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "MoEExpertImbalanceHigh", "exp_alerts": []},
            {
                "eval_time": "10m",
                "alertname": "MoEExpertImbalanceHigh",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "namespace": "ns",
                            "deployment": "d",
                            "pool": "decode",
                        },
                        "exp_annotations": {
                            "summary": "Expert load of ns/d pool decode is imbalanced",
                            "description": "Balancedness (mean/max GPU load, 1 = perfect) is 0.80, below 0.85 for "
                            "5m: the busiest GPU sets the pace of every MoE layer.",
                            "runbook_url": RUNBOOK + "moeexpertimbalancehigh",
                        },
                    }
                ],
            },
        ],
    }


def latency_and_scrape_case() -> dict[str, Any]:
    """Slow TTFT and a pool without SGLang series, in this deployment and in another: only ours alert."""
    ttft = "sglang:time_to_first_token_seconds"
    inputs: list[dict[str, str]] = []
    for dep in ("d", "e"):
        labels = {
            **target("ns", dep, "decode", f"{dep}-decode-0-0", "10.0.0.1"),
            **tokenizer_labels("decode"),
        }
        inputs += histogram(ttft, {**labels, "is_streaming": "true"}, {"4.0": 60})
        inputs += histogram(ttft, {**labels, "is_streaming": "false"}, {"4.0": 6})
        ready = f'moe_operator_pool_ready_instances{{namespace="ns",deployment="{dep}",pool="%s"}}'
        inputs += [
            {"series": ready % "decode", "values": "1x30"},
            {"series": ready % "prefill", "values": "1x30"},
        ]
        sched = {
            **target("ns", dep, "decode", f"{dep}-decode-0-0", "10.0.0.1"),
            **scheduler_labels("decode", 0, 0),
        }
        inputs.append({"series": series("sglang:num_running_reqs", sched), "values": "4x30"})
    ttft_alert = {
        "exp_labels": {"severity": "warning", "namespace": "ns", "deployment": "d", "pool": "decode"},
        "exp_annotations": {
            "summary": "Time to first token of ns/d pool decode is high",
            # 66 requests/min in (2s, 4s], streaming or not: p95 = 2 + 2 * 0.95
            "description": "p95 time to first token is 3.9s, above the 2s target, for 10 minutes.",
            "runbook_url": RUNBOOK + "moetimetofirsttokenhigh",
        },
    }
    absent_alert = {
        "exp_labels": {"severity": "warning", "namespace": "ns", "deployment": "d", "pool": "prefill"},
        "exp_annotations": {
            "summary": "No SGLang metrics from ns/d pool prefill",
            "description": "The operator reports 1 ready instance(s) but Prometheus scrapes no sglang:* series for "
            "the pool (port http not scraped, relabeling broken or --enable-metrics off): the latency and "
            "load-reporting alerts are blind.",
            "runbook_url": RUNBOOK + "moeenginemetricsabsent",
        },
    }
    expected = [
        {"eval_time": "20m", "alertname": "MoETimeToFirstTokenHigh", "exp_alerts": [ttft_alert]},
        {"eval_time": "20m", "alertname": "MoEEngineMetricsAbsent", "exp_alerts": [absent_alert]},
    ]
    return {
        "name": "latency and scrape alerts of this deployment only",
        "interval": "1m",
        "input_series": inputs,
        "alert_rule_test": expected,
    }


def test_rendered_rule_fires_for_its_deployment_with_its_thresholds(tmp_path: Path) -> None:
    rule = prometheus_rule(spec(minBalancedness=0.85, alertFor="5m"), OWNER)
    result = run(tmp_path, rule, [imbalance_case(), latency_and_scrape_case()])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cases_tell_thresholds_apart(tmp_path: Path) -> None:
    """With the defaults (0.7, 15m) the imbalance case's expectations fail: the case measures the knobs."""
    rule = prometheus_rule(spec(), OWNER)
    result = run(tmp_path, rule, [imbalance_case()])
    assert result.returncode != 0 and "MoEExpertImbalanceHigh" in result.stdout + result.stderr
