"""Prometheus gauges mirroring each MoEDeployment's status, for alerts (policies/prometheus)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_operator.handlers.state import OperatorState
from moe_operator.render.group import Owner


def export_status(op: OperatorState, owner: Owner, status: Mapping[str, Any]) -> None:
    """Mirror pools and conditions; a condition's old reason series is dropped when it changes."""
    m, ns, name = op.metrics, owner.namespace, owner.name
    for pool, s in (status.get("pools") or {}).items():
        m.gauge("moe_operator_pool_ready_instances", ns, name, pool).set(s.get("readyReplicas", 0))
        m.gauge("moe_operator_pool_desired_instances", ns, name, pool).set(s.get("desiredReplicas", 0))
    reasons = op.deployment(owner.uid).condition_reasons
    for cond in status.get("conditions") or []:
        type_, reason = str(cond["type"]), str(cond["reason"])
        old = reasons.get(type_)
        if old is not None and old != reason:
            m.remove("moe_operator_condition", ns, name, type_, old)
        reasons[type_] = reason
        m.gauge("moe_operator_condition", ns, name, type_, reason).set(1 if cond["status"] == "True" else 0)
