"""Prometheus metrics of the sidecar (prefix ``moe_runtime_``; alert rules are written against them).

One registry per sidecar (not the global one) so tests and the replay engine can run
several. Plugin counters live in the engine process; they reach Prometheus through
plugin-status.json and a collector that re-exposes them as counters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from moe_contract.startup import START_PHASES
from moe_runtime import exchange
from moe_runtime.sidecar.state import Evaluation, SidecarState, Window

P = "moe_runtime_"
SIDECAR_ERROR_STAGES = ("ingest", "plugin-files", "plugin-status", "recorder")
SOURCES = ("operator", "planner", "original", "init", "trivial")
REFUSALS = ("unauthorized", "too_large", "bad_body")
LISTENERS = ("api", "probes", "metrics")
# PUT /v1/plan: planned, failed (no fresh window, the planner refused), replaced by a newer
# request before it started, rejected before it was queued (body, shape)
PLAN_RESULTS = ("done", "failed", "replaced", "rejected")
PLAN_SECONDS_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class RuntimeMetrics:
    def __init__(self, state: SidecarState, registry: CollectorRegistry | None = None) -> None:
        self.state = state
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # not `instance`: Prometheus would rename it exported_instance (its target label wins)
        self.info = Gauge(
            P + "info", "Runtime identity (value 1).", ["engine_instance", "role", "version"], registry=r
        )
        self.engine_ready = Gauge(
            P + "engine_ready", "1 when the engine answers its health check.", registry=r
        )
        self.windows = Counter(P + "windows", "Load windows received from the engine.", registry=r)
        self.passes = Counter(P + "forward_passes", "Forward passes counted in received windows.", registry=r)
        self.assignments = Counter(
            P + "routed_assignments",
            "Token-to-expert assignments counted (tokens x top-k x MoE layers).",
            registry=r,
        )
        self.tokens = Counter(
            P + "tokens", "Routed tokens counted (busiest layer's assignments / top-k).", registry=r
        )
        self.window_ts = Gauge(P + "window_timestamp_seconds", "End time of the latest window.", registry=r)
        self.window_passes = Gauge(P + "window_passes", "Forward passes in the latest window.", registry=r)
        self.layer_bal = Gauge(
            P + "layer_balancedness",
            "Per MoE layer: mean/max tokens over GPUs of the current placement on the latest window.",
            ["layer"],
            registry=r,
        )
        self.layer_max_mean = Gauge(
            P + "layer_max_mean_ratio",
            "Per MoE layer: max/mean tokens over GPUs (1.0 = perfect).",
            ["layer"],
            registry=r,
        )
        # Whole-placement gauges appear only after the first evaluation: a 0 before any window
        # would read as "perfectly imbalanced" and fire the imbalance alerts.
        self.last_evaluation: Evaluation | None = None
        self.pushes = Counter(P + "placement_pushes", "Placement pushes by result.", ["result"], registry=r)
        self.errors = Counter(P + "sidecar_errors", "Sidecar errors by stage.", ["stage"], registry=r)
        for stage in SIDECAR_ERROR_STAGES:  # from 0, so that increase() sees the first error
            self.errors.labels(stage)
        self.refused = Counter(
            P + "api_refused",
            "API requests refused before reaching any state, by reason.",
            ["reason"],
            registry=r,
        )
        self.recorder_dumps = Counter(
            P + "recorder_dumps",
            "Static mode: dumps of SGLang's expert-distribution recorder, by result.",
            ["result"],
            registry=r,
        )
        self.plans = Counter(
            P + "plans", "Plan requests of the operator (PUT /v1/plan), by result.", ["result"], registry=r
        )
        self.plan_seconds = Histogram(
            P + "plan_seconds",
            "Wall time of the plans this runtime made for its own instance.",
            buckets=PLAN_SECONDS_BUCKETS,
            registry=r,
        )
        for result in PLAN_RESULTS:
            self.plans.labels(result)
        for result in ("accepted", "refreshed", "rejected", "unauthorized"):
            self.pushes.labels(result)
        for reason in REFUSALS:
            self.refused.labels(reason)
        # listener name -> (open connections, evicted, refused); set by the running sidecar
        self.listener_stats: Callable[[], dict[str, dict[str, int]]] = lambda: {n: {} for n in LISTENERS}
        r.register(_DynamicCollector(state))
        r.register(_ListenerCollector(self))
        r.register(_EvaluationCollector(self))

    def observe_window(self, window: Window, evaluation: Evaluation | None) -> None:
        rec = window.record
        self.windows.inc()
        self.passes.inc(rec.passes)
        self.assignments.inc(window.assignments)
        tokens = window.tokens(self.state.layout.top_k)
        if tokens is not None:
            self.tokens.inc(tokens)
        self.window_ts.set(rec.ended_at)
        self.window_passes.set(rec.passes)
        if evaluation is not None:
            self.observe_evaluation(evaluation)

    def observe_evaluation(self, ev: Evaluation) -> None:
        self.layer_bal.clear()
        self.layer_max_mean.clear()
        for layer, bal, mm in zip(
            ev.layers.tolist(), ev.balancedness.tolist(), ev.max_mean.tolist(), strict=True
        ):
            self.layer_bal.labels(str(layer)).set(bal)
            self.layer_max_mean.labels(str(layer)).set(mm)
        self.last_evaluation = ev


class _DynamicCollector(Collector):
    """Values computed at scrape time: the engine's start-up phase, placement versions and ages,
    plugin counters."""

    def __init__(self, state: SidecarState) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        s = self.state
        now = time.time()
        start = s.start_status()
        if start is not None:  # no series where no engine output is read (sidecar, replay)
            phases = GaugeMetricFamily(
                P + "start_phase",
                "The engine's start-up phase, read from its log (1 for the current phase).",
                labels=["phase"],
            )
            for phase in START_PHASES:
                phases.add_metric([phase], 1.0 if phase == start["phase"] else 0.0)
            yield phases
        pushed = s.pushed
        yield GaugeMetricFamily(
            P + "placement_version",
            "Version of the operator placement the sidecar holds (-1: none).",
            value=pushed.version if pushed else -1,
        )
        yield GaugeMetricFamily(
            P + "placement_age_seconds",
            "Seconds since the operator generated (or last re-confirmed) the held placement (-1: none).",
            value=pushed.age(now) if pushed else -1,
        )
        applied = s.applied
        yield GaugeMetricFamily(
            P + "placement_applied_version",
            "Operator version of the map the engine applied last (-1: not an operator map).",
            value=applied.version if applied and applied.version is not None else -1,
        )
        yield GaugeMetricFamily(
            P + "placement_applied_timestamp_seconds",
            "When the engine applied its current map (0: trivial since start).",
            value=applied.applied_at if applied else 0,
        )
        src = GaugeMetricFamily(
            P + "placement_applied_source",
            "Where the applied map came from (1 for the current source).",
            labels=["source"],
        )
        current = applied.source if applied else "trivial"
        for name in SOURCES:
            src.add_metric([name], 1.0 if name == current else 0.0)
        yield src
        status = s.plugin_status
        errors = CounterMetricFamily(
            P + "plugin_errors",
            "EPLB plugin errors by stage (counted in the engine process).",
            labels=["stage"],
        )
        for stage in exchange.ERROR_STAGES:
            errors.add_metric([stage], _number(status, "errors", stage))
        yield errors
        windows = CounterMetricFamily(
            P + "plugin_windows",
            "Windows the EPLB plugin exported, by their step samples (missing: passes routed tokens "
            "but their order was unreadable, so the operator plans this instance on window sums).",
            labels=["step_samples"],
        )
        for kind in exchange.WINDOW_SAMPLES:
            windows.add_metric([kind], _number(status, "windows", kind))
        yield windows
        decisions = CounterMetricFamily(
            P + "plugin_decisions", "EPLB plugin decisions by source of the map.", labels=["source"]
        )
        for name in exchange.DECISION_SOURCES:
            decisions.add_metric([name], _number(status, "decisions", name))
        yield decisions
        yield GaugeMetricFamily(
            P + "plugin_hook_seconds",
            "Last rebalance hook's own time (planner and SGLang's algorithm excluded).",
            value=_number(status, "last", "hook_seconds"),
        )
        yield GaugeMetricFamily(
            P + "plugin_planner_seconds",
            "Last planner run inside the hook.",
            value=_number(status, "last", "planner_seconds"),
        )


def _number(status: dict[str, Any], group: str, key: str) -> float:
    """One count or duration of plugin-status.json; 0 where the file holds none there (a
    malformed file must not fail the whole scrape)."""
    table = status.get(group)
    value = table.get(key, 0) if isinstance(table, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return 0.0
    return number if math.isfinite(number) and number >= 0 else 0.0


class _EvaluationCollector(Collector):
    """The latest evaluation's whole-placement gauges; nothing until there is one."""

    def __init__(self, metrics: RuntimeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ev = self.metrics.last_evaluation
        if ev is None:
            return
        values = (
            (
                P + "balancedness",
                "Mean over MoE layers of layer balancedness.",
                float(ev.balancedness.mean()),
            ),
            (P + "balancedness_min", "Worst layer's balancedness.", float(ev.balancedness.min())),
            (P + "max_mean_ratio", "Mean over MoE layers of max/mean GPU load.", float(ev.max_mean.mean())),
            (P + "max_mean_ratio_max", "Worst layer's max/mean GPU load.", float(ev.max_mean.max())),
            (
                P + "hottest_expert_share",
                "Largest share of a layer's assignments taken by one expert.",
                ev.hottest_share,
            ),
            (
                P + "hottest_expert_fair_share_ratio",
                "Hottest expert's share / fair share (1/E).",
                ev.hottest_fair_ratio,
            ),
        )
        for name, doc, value in values:
            yield GaugeMetricFamily(name, doc, value=value)


class _ListenerCollector(Collector):
    """Per listener (api, probes, metrics): open connections, evicted slow ones, refused at the cap."""

    def __init__(self, metrics: RuntimeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        stats = self.metrics.listener_stats()
        now = GaugeMetricFamily(
            P + "listener_connections", "Open connections per listener.", labels=["listener"]
        )
        evicted = CounterMetricFamily(
            P + "listener_evicted",
            "Connections closed at the listener's cap because their headers were still incomplete.",
            labels=["listener"],
        )
        refused = CounterMetricFamily(
            P + "listener_refused",
            "Connections refused with 503 at the listener's cap (every slot serving a request).",
            labels=["listener"],
        )
        for name, st in sorted(stats.items()):
            now.add_metric([name], float(st.get("open", 0)))
            evicted.add_metric([name], float(st.get("evicted", 0)))
            refused.add_metric([name], float(st.get("refused", 0)))
        yield now
        yield evicted
        yield refused
