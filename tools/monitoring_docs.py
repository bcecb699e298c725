"""Generated monitoring files: the alert rule file, its chart copy and docs/alerts.md's tables.

    .venv/bin/python tools/monitoring_docs.py generate   # write them
    .venv/bin/python tools/monitoring_docs.py check      # exit 1 when one is stale

Sources (code, not prose): the rules and knobs in moe_operator.render.alert_rules; the
runtime sidecar's metrics (moe_runtime.sidecar.metrics, read off a live registry); the
operator's (moe_operator.handlers.metrics.METRICS); SGLang's catalog
(policies/prometheus/sglang-0.5.23.metrics.yaml, generated from the wheel by
tools/sglang_metrics.py). ``names_in`` / ``known_series`` let the tests check that every metric
docs/alerts.md or the rule file names exists.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "policies" / "prometheus" / "moe-alerts.rules.yaml"
CHART_RULES = REPO / "charts" / "moe-operator" / "files" / "moe-alerts.rules.yaml"
DOC = REPO / "docs" / "alerts.md"
SGLANG_CATALOG = REPO / "policies" / "prometheus" / "sglang-0.5.23.metrics.yaml"
# Identifiers in docs/alerts.md that look like metrics but are not (the SGLang plugin's entry point).
NOT_METRICS = {"moe_operator_eplb"}
METRIC_NAME = re.compile(
    r"\b(?:sglang:[a-zA-Z0-9_:]*[a-zA-Z0-9]|moe_runtime_[a-z0-9_]*[a-z0-9]|moe_operator_[a-z0-9_]*[a-z0-9])"
)
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_count", "_sum"),
}


@dataclass(frozen=True)
class Family:
    name: str  # the family (# TYPE line)
    series: tuple[str, ...]  # what a query names (counter: name_total)
    type: str
    labels: tuple[str, ...]
    help: str
    note: str = ""


# ------------------------------------------------------------------ the sources


def runtime_families() -> list[Family]:
    """The sidecar's families, collected from a RuntimeMetrics registry with one evaluation in it."""
    import numpy as np
    from prometheus_client import CollectorRegistry

    from moe_runtime.sidecar.metrics import RuntimeMetrics
    from moe_runtime.sidecar.state import Evaluation, SidecarState

    with tempfile.TemporaryDirectory() as d:
        registry = CollectorRegistry()
        metrics = RuntimeMetrics(SidecarState(Path(d)), registry)
        metrics.observe_evaluation(
            Evaluation(
                layers=np.array([3]),
                balancedness=np.array([0.5]),
                max_mean=np.array([2.0]),
                hottest_share=0.1,
                hottest_fair_ratio=2.0,
            )
        )
        declared = {
            getattr(c, "_name", None): tuple(getattr(c, "_labelnames", ()))
            for c in registry._collector_to_names
        }
        out = []
        for fam in registry.collect():
            labels = declared.get(fam.name)
            if labels is None:
                labels = tuple(sorted({k for s in fam.samples for k in s.labels if k != "le"}))
            out.append(Family(fam.name, _series(fam.name, fam.type), fam.type, labels, fam.documentation))
    return out


def operator_families() -> list[Family]:
    from moe_operator.handlers.metrics import METRICS

    out = []
    for d in METRICS:
        base = d.name.removesuffix("_total") if d.kind == "counter" else d.name
        out.append(Family(base, _series(base, d.kind), d.kind, tuple(d.labels), d.help))
    return out


def sglang_catalog() -> dict[str, Any]:
    catalog: dict[str, Any] = yaml.safe_load(SGLANG_CATALOG.read_text())
    return catalog


def sglang_families() -> list[Family]:
    out = []
    catalog = sglang_catalog()
    for f in catalog["families"]:
        attention = f.get("labels_by_variant", {}).get("attention-dp")
        extra = [x for x in attention if x not in f["labels"]] if attention else []
        notes = []
        if f.get("first_rank_only"):
            notes.append("first scheduler only")
        absent = [v for v in catalog["variants"] if v not in f.get("variants", catalog["variants"])]
        if absent:
            notes.append("absent in " + "; ".join(f"{v} ({catalog['variants'][v]['about']})" for v in absent))
        if extra:
            notes.append("attention DP adds " + ", ".join(f"`{x}`" for x in extra))
        if f["type"] == "histogram":
            b = f["buckets"]
            notes.append(f"{len(b) - 1} buckets, `le` {b[0]} .. {b[-2]}")
        out.append(
            Family(
                f["name"],
                tuple(f["series"]),
                f["type"],
                tuple(f["labels"]),
                f["help"],
                "; ".join(n for n in notes if n),
            )
        )
    return out


def _series(name: str, kind: str) -> tuple[str, ...]:
    return tuple(name + s for s in _SUFFIXES.get(kind, ("",)))


def known_series() -> set[str]:
    """Every series name the three sources export (what docs and rules may name)."""
    names: set[str] = set()
    for fam in [*runtime_families(), *operator_families(), *sglang_families()]:
        names.update({fam.name, *fam.series})
    return names


def names_in(text: str) -> set[str]:
    """Metric-like identifiers in a text (docs, PromQL)."""
    return {m for m in METRIC_NAME.findall(text) if m not in NOT_METRICS}


# ------------------------------------------------------------------ rendering


def rules_file() -> str:
    from moe_operator.render.alert_rules import KNOBS, Thresholds, alert_groups

    t = Thresholds()
    knobs = "\n".join(f"#   {k.title:.<44} {k.value(t):<8} ({', '.join(k.alerts)})" for k in KNOBS)
    header = (
        "# Alert rules for MoEDeployments (moe-operator). Plain Prometheus rule file: load it with\n"
        "# `rule_files:` or wrap `groups:` in a PrometheusRule (monitoring.coreos.com/v1, spec.groups).\n"
        "# GENERATED from operator/moe_operator/render/alert_rules.py by `tools/monitoring_docs.py generate`\n"
        "# (the same rules, scoped to one deployment, are its spec.monitoring PrometheusRule); in your own\n"
        "# copy edit freely. Documentation, runbooks and knobs: docs/alerts.md. Unit tests:\n"
        "# tests/policies/moe-alerts.test.yaml.\n"
        "#\n"
        "# Label contract: runtime (moe_runtime_*) and SGLang (sglang:*) series carry namespace, deployment,\n"
        "# pool and pod from the PodMonitor relabeling; operator series (moe_operator_*) carry namespace,\n"
        "# deployment and pool (moe_operator_condition: namespace, deployment, type, reason) and are\n"
        "# scraped with honorLabels. SGLang series: policies/prometheus/sglang-0.5.23.metrics.yaml.\n"
        "#\n"
        "# Knobs (defaults):\n"
        f"{knobs}\n"
    )
    return header + _dump({"groups": alert_groups()})


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def _dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=160, allow_unicode=True)


def _table(families: list[Family], notes: bool = False) -> list[str]:
    head = "| Series | Type | Labels | Help |" + (" Notes |" if notes else "")
    rows = [head, "|---|---|---|---|" + ("---|" if notes else "")]
    for f in sorted(families, key=lambda f: f.series[0]):
        series = ", ".join(f"`{s}`" for s in f.series)
        labels = ", ".join(f"`{x}`" for x in f.labels) or "-"
        row = f"| {series} | {f.type} | {labels} | {f.help.replace('|', '/')} |"
        rows.append(row + (f" {f.note or '-'} |" if notes else ""))
    return rows


def _sglang_rows_named(doc_text: str) -> list[Family]:
    """The SGLang families the rules or the hand-written parts of docs/alerts.md name."""
    from moe_operator.render.alert_rules import alert_groups

    named = names_in(_dump(alert_groups())) | names_in(_strip_generated(doc_text))
    return [f for f in sglang_families() if named & {f.name, *f.series}]


def sections(doc_text: str) -> dict[str, str]:
    """The generated blocks of docs/alerts.md."""
    from moe_operator.render.alert_rules import KNOBS, Thresholds, alerts

    t = Thresholds()
    knob_rows = ["| Knob | Default | Alerts |", "|---|---|---|"]
    for k in KNOBS:
        knob_rows.append(f"| {k.title} | `{k.value(t)}` | {', '.join(k.alerts)} |")
    alert_rows = ["| Alert | Severity | Fires when | for |", "|---|---|---|---|"]
    for group in alerts(t).values():
        for a in group:
            alert_rows.append(f"| {a.name} | {a.severity} | {a.fires_when} | {a.for_} |")
    return {
        "runtime-metrics": "\n".join(_table(runtime_families())),
        "operator-metrics": "\n".join(_table(operator_families())),
        "sglang-metrics": "\n".join(_table(_sglang_rows_named(doc_text), notes=True)),
        "knobs": "\n".join(knob_rows),
        "alerts": "\n".join(alert_rows),
    }


_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[a-z-]+) .*?-->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


def _strip_generated(text: str) -> str:
    return _BLOCK.sub("", text)


def render_doc(text: str) -> str:
    wanted = sections(text)
    found: set[str] = set()

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in wanted:
            raise SystemExit(f"docs/alerts.md: unknown generated block {name!r}")
        found.add(name)
        return f"{m.group(1)}{wanted[name]}\n{m.group(4)}"

    out = _BLOCK.sub(fill, text)
    missing = set(wanted) - found
    if missing:
        raise SystemExit(f"docs/alerts.md lacks the generated blocks {sorted(missing)}")
    return out


def outputs() -> dict[Path, str]:
    rules = rules_file()
    return {RULES: rules, CHART_RULES: rules, DOC: render_doc(DOC.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["generate", "check"])
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if path.read_text() != text:
            stale.append(str(path.relative_to(REPO)))
            if args.command == "generate":
                path.write_text(text)
    if args.command == "check" and stale:
        print("stale: " + ", ".join(stale) + ": run `.venv/bin/python tools/monitoring_docs.py generate`")
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
