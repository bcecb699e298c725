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


def _tick(metrics: OperatorMetrics, reason: str, instances: int, need: int) -> None:
    op: Any = SimpleNamespace(metrics=metrics)
    body = kopf.Body({"metadata": {"namespace": "ns", "name": "d", "uid": "u"}})
    decision = PoolDecision(instances, instances, reason, reason, need, PoolState(instances, {}))
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


def test_a_tick_exports_the_need_beside_the_instances_kept() -> None:
    """MoEAutoscalerAtLimit compares kind=need with kind=target."""
    metrics = OperatorMetrics()
    _tick(metrics, "steady", 4, 6)
    sample = metrics.registry.get_sample_value
    assert sample("moe_operator_autoscale_instances", {**POOL, "kind": "need"}) == 6
    assert sample("moe_operator_autoscale_instances", {**POOL, "kind": "target"}) == 4


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
