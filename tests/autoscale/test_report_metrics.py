"""What the autoscaler's tick exports for the alert rules to read (docs/alerts.md, MoEAutoscaler*)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import kopf

from moe_operator.autoscale.decide import PoolDecision, PoolState
from moe_operator.autoscale.scale import FAILED, Scale, Step
from moe_operator.handlers.autoscale_loop import report
from moe_operator.handlers.metrics import OperatorMetrics
from moe_operator.render.alert_rules import AUTOSCALE_FAILURES

POOL = {"namespace": "ns", "deployment": "d", "pool": "decode"}


def _tick(metrics: OperatorMetrics, reason: str, instances: int, need: int, load: int | None = None) -> None:
    op: Any = SimpleNamespace(metrics=metrics)
    body = kopf.Body({"metadata": {"namespace": "ns", "name": "d", "uid": "u"}})
    load = need if load is None else load
    decision = PoolDecision(instances, instances, reason, reason, need, PoolState(instances, {}), load=load)
    step = Step(Scale(instances, instances), "")
    report(
        op,
        body,
        logging.getLogger(__name__),
        "decode",
        step,
        decision,
        {"reason": reason, "need": need},
        None,
    )


def test_a_tick_exports_what_the_load_needs_now_beside_the_instances_kept() -> None:
    """MoEAutoscalerAtLimit compares kind=need (what the load takes now, not the spare capacity
    that status's need also holds) with kind=target."""
    metrics = OperatorMetrics()
    _tick(metrics, "steady", 4, 9, load=6)
    sample = metrics.registry.get_sample_value
    assert sample("moe_operator_autoscale_instances", {**POOL, "kind": "need"}) == 6
    assert sample("moe_operator_autoscale_instances", {**POOL, "kind": "target"}) == 4


def test_a_pool_no_longer_scaled_leaves_no_series_for_an_alert() -> None:
    metrics = OperatorMetrics()
    _tick(metrics, "steady", 4, 6)
    metrics.counter("moe_operator_autoscale_scrape_failures_total", "ns", "d", "decode").inc()
    metrics.gauge("moe_operator_autoscale_instances", "ns", "d", "prefill", "need").set(3)
    metrics.gauge("moe_operator_pool_ready_instances", "ns", "d", "decode").set(4)
    metrics.forget_pool("ns", "d", "decode", "moe_operator_autoscale_")
    sample = metrics.registry.get_sample_value
    assert sample("moe_operator_autoscale_instances", {**POOL, "kind": "need"}) is None
    assert sample("moe_operator_autoscale_decisions_total", {**POOL, "reason": "steady"}) is None
    assert sample("moe_operator_autoscale_scrape_failures_total", POOL) is None
    assert sample("moe_operator_autoscale_instances", {**POOL, "pool": "prefill", "kind": "need"}) == 3
    assert sample("moe_operator_pool_ready_instances", POOL) == 4  # not the autoscaler's
    metrics.forget("ns", "d")  # what forget_pool took is no longer tracked, the rest still is
    assert sample("moe_operator_autoscale_instances", {**POOL, "pool": "prefill", "kind": "need"}) is None


def test_the_failure_reasons_exist_at_zero_before_the_first_one() -> None:
    """increase() over a series that appears at 1 reads 0: MoEAutoscalerChangeFailing would miss
    the first rollback of a process's life."""
    metrics = OperatorMetrics()
    _tick(metrics, "steady", 2, 2)
    sample = metrics.registry.get_sample_value
    for reason in FAILED:
        assert sample("moe_operator_autoscale_decisions_total", {**POOL, "reason": reason}) == 0
    assert sample("moe_operator_autoscale_decisions_total", {**POOL, "reason": "steady"}) == 1
    _tick(metrics, "rolled_back", 2, 3)
    assert sample("moe_operator_autoscale_decisions_total", {**POOL, "reason": "rolled_back"}) == 1
    metrics.forget("ns", "d")  # a deleted deployment leaves none behind
    assert sample("moe_operator_autoscale_decisions_total", {**POOL, "reason": "width_stuck"}) is None


def test_the_alert_matches_every_failure_reason_the_autoscaler_writes() -> None:
    assert AUTOSCALE_FAILURES.split("|") == list(FAILED)
