"""The chart's monitoring objects against what the operator renders: the engine PodMonitor scrapes
SGLang (port http) and the runtime (port metrics, not the API port) on every engine pod and nothing on the router;
the operator's monitors keep its series' namespace label (honorLabels)."""

from __future__ import annotations

import pytest
from test_chart import CHART, helm, objects, one, template

from moe_contract.pod import METRICS_PORT
from moe_operator.api import keys as K
from moe_operator.render.children import render_children
from moe_operator.render.engine import engine_config
from moe_operator.render.group import Owner, RuntimeSettings
from prom_relabel import targets
from render_cases import TWO_CLIQUE_PLAN, gb200_decode_spec


def rendered_pods() -> list[dict]:
    spec = gb200_decode_spec()
    out = []
    for obj in render_children(spec, Owner("m", "ns", "uid"), TWO_CLIQUE_PLAN, RuntimeSettings()):
        if obj["kind"] in ("StatefulSet", "Deployment"):
            out.append(obj["spec"]["template"])
    return out


def test_engine_pod_monitor_scrapes_sglang_and_runtime_metrics_of_every_engine_pod() -> None:
    spec = gb200_decode_spec()
    monitor = one(objects(template("monitoring.enginePodMonitor.enabled=true")), "PodMonitor")
    pods = rendered_pods()
    engine_pods = [p for p in pods if K.POOL in p["metadata"]["labels"]]
    assert engine_pods and len(engine_pods) < len(pods), "the render has engine and router pods"
    scraped = targets(monitor, pods)
    assert set(scraped) == {"http", "metrics"}
    assert [port for port, _ in scraped["http"]] == [spec.engine.port] * len(engine_pods)
    assert [port for port, _ in scraped["metrics"]] == [METRICS_PORT] * len(engine_pods)
    for _port, labels in scraped["http"] + scraped["metrics"]:
        assert labels["deployment"] == "m" and labels["pool"] == "decode"
    assert engine_config(spec, "decode")["enableMetrics"] is True


@pytest.mark.parametrize(
    ("kind", "key"), [("PodMonitor", "podMetricsEndpoints"), ("ServiceMonitor", "endpoints")]
)
def test_operator_monitors_honor_the_series_namespace(kind: str, key: str) -> None:
    setting = {"PodMonitor": "podMonitor", "ServiceMonitor": "serviceMonitor"}[kind]
    monitor = one(objects(template(f"monitoring.{setting}.enabled=true")), kind)
    (endpoint,) = monitor["spec"][key]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("monitoring.labels.release=has space", "/monitoring/labels/release"),
        ("monitoring.enginePodMonitor.namespaces={Bad_NS}", "/monitoring/enginePodMonitor/namespaces/0"),
    ],
)
def test_schema_rejects_bad_monitoring_values(setting: str, message: str) -> None:
    proc = helm("template", "moe", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert message in proc.stderr, proc.stderr
