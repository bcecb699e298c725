"""The operator's Prometheus metrics: defined once as data, registered by the process that runs.

Series carry the deployment's namespace and name first; ``forget`` drops every series of a
deleted deployment, so its last values cannot keep an alert firing (docs/alerts.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

Kind = Literal["counter", "gauge", "histogram"]
DEPLOYMENT_LABELS = ("namespace", "deployment")
POOL_LABELS = (*DEPLOYMENT_LABELS, "pool")


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]


METRICS: tuple[MetricDef, ...] = (
    MetricDef("moe_operator_api_requests_total", "counter", "Requests the operator sent to the Kubernetes API", ("verb",)),
    MetricDef("moe_operator_pool_ready_instances", "gauge", "Instances of a pool whose ranks all run and are ready", POOL_LABELS),
    MetricDef("moe_operator_pool_desired_instances", "gauge", "Instances of a pool the spec asks for", POOL_LABELS),
    MetricDef("moe_operator_condition", "gauge", "1 while the condition (type, reason) holds, else 0", (*DEPLOYMENT_LABELS, "type", "reason")),
    MetricDef("moe_operator_rebalances_total", "counter", "Placements published", POOL_LABELS),
    MetricDef(
        "moe_operator_rebalance_failures_total", "counter",
        "Evaluations that could not produce or deliver a placement (no windows, planner or API error, refused push)",
        (*POOL_LABELS, "reason"),
    ),
    MetricDef("moe_operator_placement_skips_total", "counter", "Evaluations that published nothing", (*POOL_LABELS, "reason")),
    MetricDef(
        "moe_operator_runtime_plans_total", "counter",
        "With --planning runtimes: instances whose own runtime proposed the map the operator then checked and "
        "scored (proposed), or that the operator planned itself (missing: an older runtime, a failure, a timeout, "
        "a refused answer)",
        (*POOL_LABELS, "result"),
    ),
    MetricDef(
        "moe_operator_placement_pushes_total", "counter",
        "Placement pushes to runtimes (mode operator: each instance its own map), by result: ok, unreachable, "
        "http_<status> for a status a sidecar gives, else http_other",
        (*POOL_LABELS, "result"),
    ),
    MetricDef("moe_operator_placement_evaluation_seconds", "histogram", "Time of one pool evaluation", POOL_LABELS),
    MetricDef("moe_operator_placement_balancedness", "gauge", "Balancedness (mean/max GPU load); eplb mode operator: the mean over the pool's instances, each on its own window", (*POOL_LABELS, "kind")),
    MetricDef("moe_operator_placement_version", "gauge", "Published placement version (0: trivial)", POOL_LABELS),
    MetricDef("moe_operator_placement_age_seconds", "gauge", "Seconds since the placement was published", POOL_LABELS),
    MetricDef("moe_operator_autoscale_instances", "gauge", "Instances the autoscaler keeps (kind=target), the router lists (kind=serving) and the load needs now (kind=need: its rate, queue and KV room, before minReplicas, maxReplicas, gpuBudget and any spare capacity)", (*POOL_LABELS, "kind")),
    MetricDef("moe_operator_autoscale_decisions_total", "counter", "Autoscaler decisions by reason (steady, scale_out, draining, ...)", (*POOL_LABELS, "reason")),
    MetricDef("moe_operator_autoscale_scrape_failures_total", "counter", "Engine /metrics reads the autoscaler could not use", POOL_LABELS),
)  # fmt: skip

_TYPES = MappingProxyType({"counter": Counter, "gauge": Gauge, "histogram": Histogram})


class OperatorMetrics:
    """The collectors of one operator process, on its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._by_name = {
            d.name: _TYPES[d.kind](d.name, d.help, list(d.labels), registry=self.registry) for d in METRICS
        }
        self._labels = {d.name: d.labels for d in METRICS}
        self._series: defaultdict[tuple[str, str], set[tuple[str, tuple[str, ...]]]] = defaultdict(set)
        self._lock = threading.Lock()

    def of(self, name: str, *labels: str) -> Counter | Gauge | Histogram:
        """The child series; series whose first two labels are (namespace, deployment) are tracked."""
        metric = self._by_name[name]
        if self._labels[name][:2] == DEPLOYMENT_LABELS:
            with self._lock:
                self._series[(labels[0], labels[1])].add((name, labels))
        child: Counter | Gauge | Histogram = metric.labels(*labels)
        return child

    def counter(self, name: str, *labels: str) -> Counter:
        child = self.of(name, *labels)
        assert isinstance(child, Counter)
        return child

    def gauge(self, name: str, *labels: str) -> Gauge:
        child = self.of(name, *labels)
        assert isinstance(child, Gauge)
        return child

    def histogram(self, name: str, *labels: str) -> Histogram:
        child = self.of(name, *labels)
        assert isinstance(child, Histogram)
        return child

    def remove(self, name: str, *labels: str) -> None:
        """Drop one series (a condition's old reason)."""
        with self._lock:
            self._series[(labels[0], labels[1])].discard((name, labels))
        with contextlib.suppress(KeyError):
            self._by_name[name].remove(*labels)

    def forget_pool(self, namespace: str, name: str, pool: str, prefix: str) -> None:
        """Drop a pool's series of the metrics named ``prefix``*: a pool the autoscaler no longer
        sizes must not leave its last numbers for an alert to read."""
        with self._lock:
            tracked = self._series.get((namespace, name), set())
            series = {(m, labels) for m, labels in tracked if m.startswith(prefix) and labels[2:3] == (pool,)}
            tracked -= series
        self._drop(series)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted deployment."""
        with self._lock:
            series = self._series.pop((namespace, name), set())
        self._drop(series)

    def _drop(self, series: set[tuple[str, tuple[str, ...]]]) -> None:
        for metric, labels in series:
            with contextlib.suppress(KeyError):
                self._by_name[metric].remove(*labels)
