"""The promtool cases use series shaped exactly as their exporters write them, and every metric the
rules or docs/alerts.md name exists (in SGLang 0.5.23's catalog, the runtime sidecar or the operator);
the generated rule file, its chart copy and docs/alerts.md's tables are fresh."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_series import TARGET_LABELS, catalog, family_of, monitoring_docs, parse_series

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).parent / "moe-alerts.test.yaml"
RULES = ROOT / "policies" / "prometheus" / "moe-alerts.rules.yaml"
DOC = ROOT / "docs" / "alerts.md"


def input_series() -> list[str]:
    return [s["series"] for case in yaml.safe_load(TESTS.read_text())["tests"] for s in case["input_series"]]


def label_sets(fam: dict[str, Any]) -> list[set[str]]:
    return [set(fam["labels"]), *(set(v) for v in fam.get("labels_by_variant", {}).values())]


def test_sglang_series_have_sglangs_names_labels_and_buckets() -> None:
    buckets: dict[tuple[str, tuple[tuple[str, str], ...]], set[str]] = defaultdict(set)
    checked = 0
    for text in input_series():
        name, labels = parse_series(text)
        if not name.startswith("sglang:"):
            continue
        checked += 1
        fam = family_of(name)
        assert fam is not None, f"{name} is no series SGLang 0.5.23 exports"
        own = set(labels) - TARGET_LABELS - {"le"}
        assert own in label_sets(fam), f"{text}: SGLang's labels are one of {label_sets(fam)}"
        assert set(labels) >= TARGET_LABELS, f"{text}: lacks the scrape's target labels"
        if name.endswith("_bucket"):
            key = (name, tuple(sorted((k, v) for k, v in labels.items() if k != "le")))
            buckets[key].add(labels["le"])
    assert checked >= 20
    for (name, _labels), les in buckets.items():
        fam = family_of(name)
        assert fam is not None
        assert les == set(fam["buckets"]), f"{name}: every SGLang bucket, as SGLang writes `le`"


def test_the_latency_and_load_facts_the_rules_rely_on() -> None:
    """Shapes from the wheel (tests/runtime/test_sglang_metrics_catalog.py keeps the catalog true)."""
    fams = {f["name"]: f for f in catalog()["families"]}
    ttft, itl = fams["sglang:time_to_first_token_seconds"], fams["sglang:inter_token_latency_seconds"]
    assert ttft["process"] == itl["process"] == "tokenizer"
    assert ttft["labels"] == ["model_name", "engine_type", "is_streaming"]
    assert itl["labels"] == ["model_name", "engine_type"]  # no is_streaming
    assert "labels_by_variant" not in ttft and "labels_by_variant" not in itl  # no dp_rank: one tokenizer
    assert "2.0" in ttft["buckets"] and "0.1" in itl["buckets"]  # the thresholds sit on bucket bounds
    assert fams["sglang:num_requests"]["series"] == ["sglang:num_requests_total"]
    running = fams["sglang:num_running_reqs"]
    assert running["process"] == "scheduler" and "variants" not in running  # exists in every variant
    assert "dp_rank" in running["labels_by_variant"]["attention-dp"]
    bal = fams["sglang:eplb_balancedness"]
    assert bal["type"] == "summary" and bal.get("first_rank_only") and "plain" not in bal["variants"]


def test_rules_and_docs_name_only_metrics_that_exist() -> None:
    md = monitoring_docs()
    known = md.known_series()
    for path in (RULES, DOC):
        unknown = md.names_in(path.read_text()) - known
        assert not unknown, f"{path.relative_to(ROOT)} names metrics nobody exports: {sorted(unknown)}"


def test_other_series_in_the_cases_exist() -> None:
    known = monitoring_docs().known_series()
    for text in input_series():
        name, _ = parse_series(text)
        assert name in known, f"{text}: no exporter writes {name}"


@pytest.mark.parametrize("path", ["policies/prometheus/moe-alerts.rules.yaml", "docs/alerts.md"])
def test_generated_files_are_fresh(path: str) -> None:
    md = monitoring_docs()
    wanted = md.outputs()[ROOT / path]
    assert (ROOT / path).read_text() == wanted, (
        f"{path} is stale: run .venv/bin/python tools/monitoring_docs.py generate"
    )
