"""promtool input series shaped as SGLang 0.5.23 exports them (names, label names, `le` strings),
from the catalog policies/prometheus/sglang-0.5.23.metrics.yaml, plus the scrape's target labels."""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "policies" / "prometheus" / "sglang-0.5.23.metrics.yaml"
MODEL = "deepseek-ai/DeepSeek-V3"
# What a PodMonitor scrape adds (the Prometheus Operator's and the relabeling's target labels).
TARGET_LABELS = {"namespace", "deployment", "pool", "pod", "container", "endpoint", "instance", "job"}
SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\}$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@functools.cache
def catalog() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CATALOG.read_text())
    return data


def family_of(series: str) -> dict[str, Any] | None:
    """The catalog family a series name belongs to (``..._bucket`` -> its histogram)."""
    for fam in catalog()["families"]:
        if series in fam["series"]:
            return dict(fam)
    return None


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    m = SERIES.match(text.strip())
    assert m, f"not a series: {text}"
    return m.group("name"), dict(LABEL.findall(m.group("labels")))


def target(ns: str, deployment: str, pool: str, pod: str, ip: str, port: int = 30000) -> dict[str, str]:
    return {
        "namespace": ns,
        "deployment": deployment,
        "pool": pool,
        "pod": pod,
        "container": "engine",
        "endpoint": "http",
        "instance": f"{ip}:{port}",
        "job": f"{ns}/{deployment}",
    }


def tokenizer_labels(engine_type: str, **extra: str) -> dict[str, str]:
    return {"model_name": MODEL, "engine_type": engine_type, **extra}


def scheduler_labels(engine_type: str, tp_rank: int, dp_rank: int | None = None) -> dict[str, str]:
    out = {
        "model_name": MODEL,
        "engine_type": engine_type,
        "tp_rank": str(tp_rank),
        "pp_rank": "0",
        "moe_ep_rank": str(tp_rank),
    }
    if dp_rank is not None:
        out["dp_rank"] = str(dp_rank)
    return out


def series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def histogram(
    family: str, labels: dict[str, str], per_minute: dict[str, int], minutes: int = 30
) -> list[dict[str, str]]:
    """Every ``_bucket`` series of one label set; ``per_minute``: observations per minute by bucket bound."""
    fam = next(f for f in catalog()["families"] if f["name"] == family)

    def bound(le: str) -> float:
        return float("inf") if le == "+Inf" else float(le)

    assert set(per_minute) <= set(fam["buckets"]), f"not a bucket of {family}: {set(per_minute)}"
    out = []
    for le in fam["buckets"]:
        cum = sum(n for b, n in per_minute.items() if bound(b) <= bound(le))
        out.append(
            {
                "series": series(f"{family}_bucket", {**labels, "le": le}),
                "values": f"0+{cum}x{minutes}" if cum else f"0x{minutes}",
            }
        )
    return out


def monitoring_docs() -> ModuleType:
    """tools/monitoring_docs.py as a module (tools/ is no package)."""
    name = "monitoring_docs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "monitoring_docs.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
