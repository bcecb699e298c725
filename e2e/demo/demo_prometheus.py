"""The demo's Prometheus: generated scrape config, the project's rules with shortened `for:`, alert episodes.

Pure functions (no I/O) so tests/demo can check them without a Prometheus; demo.py is the shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RUNTIME_JOB = "moe-runtime"
ENGINE_JOB = "sglang"
OPERATOR_JOB = "moe-operator"


@dataclass(frozen=True)
class RuntimeTarget:
    """One replay runtime (an instance leader pod) and the labels a PodMonitor would give it."""

    namespace: str
    deployment: str
    pool: str
    pod: str
    ip: str
    metrics_port: int = 9402  # the runtime's metrics listener (moe_runtime_*), port `metrics`
    engine_port: int = 30000  # SGLang's HTTP port (sglang:*), port `http`
    instance: str = ""  # the instance whose token the runtime takes (moe_contract.auth)

    def address(self, port: int) -> str:
        return f"{self.ip}:{port}"

    @property
    def labels(self) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "deployment": self.deployment,
            "pool": self.pool,
            "pod": self.pod,
        }


def scrape_config(
    runtimes: list[RuntimeTarget], operator_address: str, rules_file: str, interval_s: int
) -> dict[str, Any]:
    """prometheus.yml: each leader pod's two /metrics, as the PodMonitors scrape them (SGLang's on
    port http, the runtime's on port metrics), with the label contract of policies/prometheus
    (namespace, deployment, pool, pod)."""
    every = f"{interval_s}s"

    def job(name: str, port: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "static_configs": [
                {"targets": [t.address(getattr(t, port))], "labels": t.labels} for t in runtimes
            ],
        }

    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "rule_files": [rules_file],
        "scrape_configs": [
            job(RUNTIME_JOB, "metrics_port"),
            job(ENGINE_JOB, "engine_port"),
            {"job_name": OPERATOR_JOB, "static_configs": [{"targets": [operator_address]}]},
        ],
    }


def shorten_for(rules: dict[str, Any], for_: str) -> tuple[dict[str, Any], list[str]]:
    """A copy of the rule groups with every alert's `for:` set to ``for_``; also lists what changed."""
    if not re.fullmatch(r"\d+[smh]", for_):
        raise ValueError(f"bad duration {for_!r}")
    changed: list[str] = []
    groups = []
    for group in rules.get("groups") or []:
        new_rules = []
        for rule in group.get("rules") or []:
            rule = dict(rule)
            if "alert" in rule and rule.get("for") != for_:
                changed.append(f"{rule['alert']} {rule.get('for', '0s')} -> {for_}")
                rule["for"] = for_
            new_rules.append(rule)
        groups.append({**group, "rules": new_rules})
    return {**rules, "groups": groups}, changed


@dataclass(frozen=True)
class Episode:
    """One contiguous firing run of one alert series (from the ALERTS{alertstate="firing"} samples)."""

    alert: str
    labels: tuple[tuple[str, str], ...]  # identity()
    fired_at: float
    last_seen: float
    resolved: bool

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


IDENTITY_DROP = {"__name__", "alertname", "alertstate", "job", "instance", "severity"}
Labels = tuple[tuple[str, str], ...]


def identity(labels: dict[str, str]) -> Labels:
    """What tells alert series apart here (pool, deployment, ...), as a hashable key."""
    return tuple(sorted((k, v) for k, v in labels.items() if k not in IDENTITY_DROP))


def episodes(
    matrix: list[dict[str, Any]], step_s: float, firing_now: set[tuple[str, Labels]]
) -> list[Episode]:
    """Split each ALERTS{alertstate="firing"} series of a range query into firing runs.

    A gap longer than two steps ends a run (resolved, fired again later); a series' last run
    has resolved unless the alert is firing now (``firing_now``: alertname and identity).
    """
    out: list[Episode] = []
    for series in matrix:
        metric = series.get("metric") or {}
        name, labels = str(metric.get("alertname", "?")), identity(metric)
        times = sorted(float(t) for t, _ in series.get("values") or [])
        run: list[float] = []
        for t in times:
            if run and t - run[-1] > 2 * step_s:
                out.append(Episode(name, labels, run[0], run[-1], True))
                run = []
            run.append(t)
        if run:
            out.append(Episode(name, labels, run[0], run[-1], (name, labels) not in firing_now))
    return sorted(out, key=lambda e: (e.fired_at, e.alert, e.labels))


def vector_by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    """An instant-query vector as {label value: number}."""
    return {
        str((r.get("metric") or {}).get(label, "")): float(r["value"][1])
        for r in result
        if r.get("value") is not None
    }
