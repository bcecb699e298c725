"""Admission: valid examples pass; every invalid spec is refused, naming the field and the fix."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_operator.api.crd import build_crd
from moe_operator.validation import PlatformPolicy, Problem, validate

from .invalid_specs import BASE_SPEC, INVALID_SPECS, InvalidSpec, build, merge_patch

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
# What the examples need the platform to grant: hostNetwork for RDMA (deepseek-v3-pd-h100) and
# node-local weights under /raid/models (deepseek-v3-gb200). The defaults grant neither.
EXAMPLES_PLATFORM = PlatformPolicy(host_path_prefixes=("/raid/models",), host_network_namespaces=("*",))
FIX_WORDS = ("set ", "use ", "remove ", "add ", "choose ", "create ", "give ", "change ", "shorten", "keep ")


def test_base_spec_is_valid() -> None:
    assert validate(BASE_SPEC) == []


def test_examples_exist_and_pass() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"deepseek-v3-pd-h100.yaml", "deepseek-v3-gb200.yaml", "qwen3-30b-a3b-single-node.yaml"} <= names
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        assert doc["kind"] == "MoEDeployment" and doc["apiVersion"] == "moe.inference.dev/v1alpha1"
        assert validate(doc["spec"], policy=EXAMPLES_PLATFORM) == [], path.name
        update = validate(doc["spec"], copy.deepcopy(doc["spec"]), EXAMPLES_PLATFORM)
        assert update == [], f"{path.name} as an update"


def test_examples_need_only_the_documented_platform_grants() -> None:
    """Under the safe defaults the examples are refused for exactly the grants they need."""
    refused = {}
    for path in EXAMPLES:
        spec = yaml.safe_load(path.read_text())["spec"]
        refused[path.stem] = sorted(p.field for p in validate(spec))
        assert validate(spec, policy=None) == [], "policy=None leaves the platform rules out"
    assert refused == {
        "deepseek-v3-gb200": ["spec.model.volume.hostPath.path"],
        "deepseek-v3-pd-h100": [],
        "qwen3-235b-fp8-pd-h200-roce": ["spec.topology.hostNetwork"],
        "qwen3-30b-a3b-single-node": [],
    }


def test_enough_distinct_cases_on_every_layer() -> None:
    names = [c.name for c in INVALID_SPECS]
    assert len(set(names)) == len(names) >= 25
    layers = Counter(c.layer for c in INVALID_SPECS)
    assert layers["schema"] >= 8 and layers["cel"] >= 14 and layers["webhook"] >= 12
    assert sum(c.old_patch is not None for c in INVALID_SPECS) >= 5


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda c: c.name)
def test_invalid_spec_is_refused_with_field_and_fix(case: InvalidSpec) -> None:
    spec, old = build(case)
    problems = validate(spec, old)
    matching = [p for p in problems if p.field == case.field]
    assert matching, f"no problem on {case.field}; got {[str(p) for p in problems]}"
    problem = next((p for p in matching if case.text in p.message), None)
    assert problem is not None, f"{case.text!r} not in {[p.message for p in matching]}"
    assert case.field in problem.message, "the message must name the field"
    assert any(word in problem.message for word in FIX_WORDS), "the message must say what to change"


def _schema_at(schema: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """Schema nodes from the spec root down to ``path`` (spec.a.b[0].c)."""
    nodes = [schema]
    for part in path.replace("[", ".[").split(".")[1:]:
        node = nodes[-1]
        node = node["items"] if part.startswith("[") else node["properties"][part]
        nodes.append(node)
    return nodes


@pytest.mark.parametrize("case", [c for c in INVALID_SPECS if c.layer == "cel"], ids=lambda c: c.name)
def test_cel_cases_are_backed_by_a_crd_rule(case: InvalidSpec) -> None:
    """A CEL case names a field that some x-kubernetes-validations rule targets."""
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    parts = case.field.split(".")
    nodes = _schema_at(spec_schema, case.field)
    for depth, node in enumerate(nodes):
        remainder = parts[depth + 1 :]
        for rule in node.get("x-kubernetes-validations", []):
            target = rule.get("fieldPath", "").lstrip(".").split(".") if rule.get("fieldPath") else []
            if target == remainder or (not target and len(remainder) <= 1):
                return
    pytest.fail(f"no CEL rule targets {case.field}")


def test_update_rules_only_fire_on_change() -> None:
    assert validate(BASE_SPEC, copy.deepcopy(BASE_SPEC)) == []
    scaled = merge_patch(BASE_SPEC, {"decode": {"replicas": 5}, "eplb": {"mode": "engine"}})
    assert validate(scaled, BASE_SPEC) == []


def test_defaults_alone_make_a_valid_spec() -> None:
    assert validate({"model": {"name": "qwen3-30b-a3b"}}) == []


def test_minimal_deepseek_on_one_h100_node_is_refused_with_smallest_fit() -> None:
    problems = validate({"model": {"name": "deepseek-v3"}})
    assert [p.field for p in problems] == ["spec.decode.nodesPerReplica"]
    assert "at least 2" in problems[0].message and "GiB" in problems[0].message


def test_mem_fraction_flag_is_honoured() -> None:
    tight = merge_patch(BASE_SPEC, {"engine": {"extraArgs": ["--mem-fraction-static", "0.3"]}})
    fields = {p.field for p in validate(tight)}
    assert "spec.prefill.nodesPerReplica" in fields


def test_problem_str_names_field_once() -> None:
    assert str(Problem("spec.x", "spec.x must be set")) == "spec.x must be set"
    assert str(Problem("spec.x", "must be set")) == "spec.x: must be set"


def test_problems_are_not_repeated() -> None:
    spec = merge_patch(BASE_SPEC, {"eplb": {"mode": "off"}})
    problems = validate(spec)
    assert len(problems) == len(set(problems))
