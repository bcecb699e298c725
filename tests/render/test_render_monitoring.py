"""spec.monitoring's PodMonitor and PrometheusRule (render/monitoring.py), checked against what the
operator renders for the pods: Prometheus' relabeling is applied to the rendered pod templates."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from moe_contract.pod import METRICS_PORT, SIDECAR_PORT
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.render.alert_rules import Scope, Thresholds, alert_groups
from moe_operator.render.children import render_children
from moe_operator.render.engine import engine_config
from moe_operator.render.group import Owner, RuntimeSettings
from moe_operator.render.monitoring import (
    REQUIRED_RESOURCES,
    monitoring_objects,
    pod_monitor,
    prometheus_rule,
)
from prom_relabel import selects, targets
from render_cases import REPO, TWO_CLIQUE_PLAN, gb200_decode_spec

OWNER = Owner("m", "ns", "uid-1")


def spec_with(monitoring: dict[str, Any]) -> MoEDeploymentSpec:
    data = gb200_decode_spec().model_dump(by_alias=True, exclude_none=True)
    data["monitoring"] = {**data["monitoring"], **monitoring}
    return MoEDeploymentSpec.model_validate(data)


def pods(spec: MoEDeploymentSpec) -> list[dict[str, Any]]:
    """Every pod template the operator renders for the spec (engine ranks and the router)."""
    out = []
    for obj in render_children(spec, OWNER, TWO_CLIQUE_PLAN, RuntimeSettings()):
        if obj["kind"] in ("StatefulSet", "Deployment"):
            out.append(obj["spec"]["template"])
    return out


def test_pod_monitor_scrapes_sglang_sidecar_and_router_of_every_pod() -> None:
    spec = gb200_decode_spec()
    monitor = pod_monitor(spec, OWNER)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    assert REQUIRED_RESOURCES["PodMonitor"] == "podmonitors"
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    # SGLang's port, the runtime's metrics listener and the router's: never the API port `runtime`.
    assert [e["port"] for e in endpoints] == ["http", "metrics", "metrics"]
    assert all(e["path"] == "/metrics" for e in endpoints)
    assert all(selects(monitor, pod) for pod in pods(spec)), (
        "the PodMonitor selects every pod of the deployment"
    )
    scraped = targets(monitor, pods(spec))
    engine_pods = [p for p in pods(spec) if K.POOL in p["metadata"]["labels"]]
    # SGLang's /metrics on every engine pod (leaders and workers), on spec.engine.port; never the router.
    assert len(scraped["http"]) == len(engine_pods) == 2
    assert {port for port, _ in scraped["http"]} == {spec.engine.port}
    assert "runtime" not in scraped and SIDECAR_PORT not in {port for t in scraped.values() for port, _ in t}
    runtime = [(port, t) for port, t in scraped["metrics"] if port != 29000]
    assert [port for port, _ in runtime] == [METRICS_PORT] * len(engine_pods)
    for _port, target in scraped["http"] + runtime:
        assert target["deployment"] == "m" and target["pool"] == "decode" and target["pod"]
    (router_target,) = [t for port, t in scraped["metrics"] if port == 29000]
    assert router_target["deployment"] == "m" and "pool" not in router_target
    # What the http endpoint scrapes exists: the engine runs with --enable-metrics.
    assert engine_config(spec, "decode")["enableMetrics"] is True
    router = next(p for p in pods(spec) if p["metadata"]["labels"]["app.kubernetes.io/component"] == "router")
    command = router["spec"]["containers"][0]["command"]
    assert command[command.index("--prometheus-port") + 1] == "29000"


def test_metadata_owner_and_labels() -> None:
    spec = spec_with({"labels": {"release": "kube-prometheus-stack", "app.kubernetes.io/managed-by": "me"}})
    for obj in monitoring_objects(spec, OWNER):
        meta = obj["metadata"]
        assert meta["name"] == "m" and meta["namespace"] == "ns"
        assert meta["ownerReferences"] == [OWNER.reference()]
        assert meta["labels"]["release"] == "kube-prometheus-stack"
        # The operator's own labels win: it finds its children by them.
        assert meta["labels"]["app.kubernetes.io/managed-by"] == K.MANAGED_BY
        assert meta["labels"][K.DEPLOYMENT] == "m"


def test_objects_follow_the_spec_switches() -> None:
    kinds = lambda spec: [o["kind"] for o in monitoring_objects(spec, OWNER)]  # noqa: E731
    assert kinds(spec_with({})) == ["PodMonitor", "PrometheusRule"]
    assert kinds(spec_with({"podMonitor": False})) == ["PrometheusRule"]
    assert kinds(spec_with({"prometheusRule": False})) == ["PodMonitor"]
    assert kinds(spec_with({"podMonitor": False, "prometheusRule": False})) == []


def rules_of(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in obj["spec"]["groups"] for r in g["rules"]}


def test_prometheus_rule_uses_min_balancedness_and_alert_for() -> None:
    rule = prometheus_rule(spec_with({"minBalancedness": 0.85, "alertFor": "5m"}), OWNER)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert REQUIRED_RESOURCES["PrometheusRule"] == "prometheusrules"
    rules = rules_of(rule)
    for name in ("MoEExpertImbalanceHigh", "MoEPlacementStaleWhileImbalanced"):
        assert rules[name]["for"] == "5m"
        expr = rules[name]["expr"]
        assert re.search(r"\(moe_runtime_balancedness\{[^}]*\}\) < 0\.85\)?\n", expr), expr
    assert "below 0.85 for 5m" in rules["MoEExpertImbalanceHigh"]["annotations"]["description"]
    # The others keep the documented thresholds.
    assert rules["MoEPoolUnavailable"]["for"] == "5m" and rules["MoETimeToFirstTokenHigh"]["for"] == "10m"
    assert rules["MoETimeToFirstTokenHigh"]["expr"].rstrip().endswith("> 2")


def test_every_selector_is_scoped_to_the_deployment() -> None:
    rule = prometheus_rule(spec_with({}), OWNER)
    metric = re.compile(r"(sglang:[a-z_:]+|moe_(?:runtime|operator)_[a-z_]+)(\{[^}]*\})?")
    for r in rules_of(rule).values():
        found = metric.findall(r["expr"])
        assert found, r["expr"]
        for name, matchers in found:
            assert 'namespace="ns"' in matchers and 'deployment="m"' in matchers, f"{r['alert']}: {name}"


def test_defaults_are_the_cluster_wide_rules_scoped() -> None:
    """Same alerts as policies/prometheus/moe-alerts.rules.yaml, only with the scope matchers."""
    import yaml

    shipped = yaml.safe_load((REPO / "policies" / "prometheus" / "moe-alerts.rules.yaml").read_text())
    scoped = prometheus_rule(spec_with({}), OWNER)["spec"]["groups"]
    unscope = lambda s: re.sub(r'\{namespace="ns", deployment="m"\}|, namespace="ns", deployment="m"', "", s)  # noqa: E731
    for g_shipped, g_scoped in zip(shipped["groups"], scoped, strict=True):
        for a, b in zip(g_shipped["rules"], g_scoped["rules"], strict=True):
            assert {**b, "expr": unscope(b["expr"])} == a
    assert scoped == alert_groups(Thresholds(), Scope("ns", "m"))


def test_scope_refuses_names_that_would_break_the_selectors() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes object name"):
        Scope("ns", 'm"} or vector(1) #')


@pytest.mark.parametrize("value", ["has space", "-leading", "x" * 64, 'quote"'])
def test_monitoring_label_values_must_be_kubernetes_label_values(value: str) -> None:
    with pytest.raises(ValidationError, match=r"monitoring\.labels"):
        spec_with({"labels": {"release": value}})
