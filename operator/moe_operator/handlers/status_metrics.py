"""Prometheus gauges mirroring each MoEDeployment's status, for alerts (policies/prometheus)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

POOL_READY = Gauge(
    "moe_operator_pool_ready_instances", "Instances of a pool whose ranks all run and are ready",
    ["namespace", "deployment", "pool"],
)  # fmt: skip
POOL_DESIRED = Gauge(
    "moe_operator_pool_desired_instances",
    "Instances of a pool the spec asks for",
    ["namespace", "deployment", "pool"],
)
CONDITION = Gauge(
    "moe_operator_condition", "1 while the condition (type, reason) holds, else 0",
    ["namespace", "deployment", "type", "reason"],
)  # fmt: skip

_last_reason: dict[tuple[str, str, str], str] = {}


def export_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """Mirror pools and conditions; a condition's old reason series is dropped when it changes."""
    for pool, s in (status.get("pools") or {}).items():
        POOL_READY.labels(namespace, name, pool).set(s.get("readyReplicas", 0))
        POOL_DESIRED.labels(namespace, name, pool).set(s.get("desiredReplicas", 0))
    for cond in status.get("conditions") or []:
        key = (namespace, name, cond["type"])
        old = _last_reason.get(key)
        if old is not None and old != cond["reason"]:
            CONDITION.remove(namespace, name, cond["type"], old)
        _last_reason[key] = cond["reason"]
        CONDITION.labels(namespace, name, cond["type"], cond["reason"]).set(
            1 if cond["status"] == "True" else 0
        )
