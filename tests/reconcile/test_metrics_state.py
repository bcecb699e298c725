"""Process state and metrics: a deleted deployment leaves no series and no memory behind."""

from __future__ import annotations

from prometheus_client import generate_latest

from moe_operator.handlers.metrics import METRICS, OperatorMetrics
from moe_operator.handlers.state import APPLY_GRACE_S, DeploymentState


def test_forget_drops_every_series_of_one_deployment_only() -> None:
    m = OperatorMetrics()
    m.gauge("moe_operator_pool_ready_instances", "ns", "a", "decode").set(1)
    m.counter("moe_operator_rebalances_total", "ns", "a", "decode").inc()
    m.gauge("moe_operator_pool_ready_instances", "ns", "b", "decode").set(2)
    m.counter("moe_operator_api_requests_total", "get").inc()
    m.forget("ns", "a")
    text = generate_latest(m.registry).decode()
    assert 'deployment="a"' not in text
    assert 'deployment="b"' in text and 'verb="get"' in text


def test_every_metric_is_defined_once_with_its_labels() -> None:
    names = [d.name for d in METRICS]
    assert len(names) == len(set(names))
    assert all(d.name.startswith("moe_operator_") for d in METRICS)


def test_recently_applied_expires_by_time() -> None:
    d = DeploymentState()
    d.remember_applied(("ConfigMap", "x"), "h1", now=100.0)
    assert d.recently_applied(100.0 + APPLY_GRACE_S - 1) == {("ConfigMap", "x"): "h1"}
    assert d.recently_applied(100.0 + APPLY_GRACE_S) == {}
    assert not d.applied
