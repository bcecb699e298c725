"""The generated CRD: structural, complete, explainable, and identical to the committed YAML."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_operator.api.crd import build_crd
from moe_operator.api.names import CRD_FILENAME
from moe_operator.cli.crds import DOCS, expected_files, render_crd_yaml

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_KEYS = {
    "type", "description", "format", "enum", "default", "nullable", "properties", "required", "items",
    "additionalProperties", "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
    "maxProperties", "anyOf", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}  # fmt: skip


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        unknown = set(node) - ALLOWED_KEYS
        assert not unknown, f"{path}: keys the apiserver does not accept: {unknown}"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node and node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node, f"{path}: no type"
            assert "anyOf" not in node, f"{path}: anyOf outside int-or-string"
        if "properties" in node:
            assert "additionalProperties" not in node, f"{path}: properties and additionalProperties"
            assert node["type"] == "object"
        untyped = "properties" not in node and "additionalProperties" not in node
        if node.get("type") == "object" and untyped and path != ".metadata":  # the apiserver owns metadata
            assert node.get("x-kubernetes-preserve-unknown-fields"), f"{path}: untyped object"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: unbounded list (CEL cost, etcd size)"
        if node.get("type") == "string" and path.startswith(".spec"):
            assert "maxLength" in node or "enum" in node, f"{path}: unbounded string"
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "$defs" not in text and "'null'" not in text and "title:" not in text


def test_every_field_is_described(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        if path.count(".") >= 2 and not path.endswith(("[]", "{}")) and not path.startswith(".metadata"):
            assert node.get("description"), f"{path}: no description for kubectl explain"


def _default_ok(node: dict[str, Any], value: Any) -> bool:
    if node.get("x-kubernetes-int-or-string"):
        return isinstance(value, int) or re.fullmatch(node["pattern"], value) is not None
    kind = node["type"]
    types: dict[str, type | tuple[type, ...]] = {
        "integer": int,
        "number": (int, float),
        "string": str,
        "boolean": bool,
        "object": dict,
        "array": list,
    }
    if not isinstance(value, types[kind]):
        return False
    if "enum" in node and value not in node["enum"]:
        return False
    if kind in ("integer", "number"):
        return bool(node.get("minimum", value) <= value <= node.get("maximum", value))
    if kind == "string" and "pattern" in node:
        return re.search(node["pattern"], str(value)) is not None
    return True


def test_defaults_validate_against_their_schema(schema: dict[str, Any]) -> None:
    found = 0
    for path, node in walk(schema):
        if "default" in node:
            found += 1
            assert _default_ok(node, node["default"]), f"{path}: default {node['default']!r} is invalid"
    assert found > 40


def test_optional_fields_are_nullable_not_any_of(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert spec["prefill"]["nullable"] is True and spec["prefill"]["type"] == "object"
    assert spec["model"]["properties"]["architecture"]["nullable"] is True
    assert spec["decode"]["properties"]["attentionDataParallel"]["nullable"] is True
    assert spec["decode"]["default"] == {} and "default" not in spec["prefill"]


def test_embedded_objects_and_quantities(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    for node in (
        spec["model"]["properties"]["volume"],
        spec["engine"]["properties"]["env"]["items"],
        spec["engine"]["properties"]["resources"],
        spec["topology"]["properties"]["tolerations"]["items"],
    ):
        assert node["x-kubernetes-preserve-unknown-fields"] is True and node["type"] == "object"
    gpu_memory = spec["topology"]["properties"]["gpuMemory"]
    # no CRD default: a spec that leaves it out gets its hardware profile's (else 80Gi, in pydantic)
    assert gpu_memory["x-kubernetes-int-or-string"] is True and "default" not in gpu_memory
    assert spec["topology"]["properties"]["nodeSelector"]["additionalProperties"]["type"] == "string"


def test_identity_subresources_and_columns(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == "moedeployments.moe.inference.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "MoEDeployment",
        "moedeployments",
        ["moed"],
    )
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.decode.replicas",
        "statusReplicasPath": ".status.pools.decode.replicas",
        "labelSelectorPath": ".status.pools.decode.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Ready", "Prefill", "Decode", "Balancedness", "Age"]


def test_printer_and_scale_paths_exist_in_status(schema: dict[str, Any], crd: dict[str, Any]) -> None:
    version = crd["spec"]["versions"][0]
    paths = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
    paths += [p for k, p in version["subresources"]["scale"].items()]
    for path in paths:
        if path.startswith(".metadata"):
            continue
        node = schema
        for part in re.sub(r"\[\?.*?\]", "", path).strip(".").split("."):
            node = node["items"] if node.get("type") == "array" else node
            node = node["properties"][part]
        assert "type" in node, path


def test_conditions_are_a_map_keyed_by_type(schema: dict[str, Any]) -> None:
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def _rules(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for path, node in walk(schema):
        for rule in node.get("x-kubernetes-validations", []):
            yield path, node, rule


def test_immutable_fields_have_transition_rules(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    for node in (spec["model"]["properties"]["name"], spec["topology"]["properties"]["gpusPerNode"]):
        assert any(r["rule"] == "self == oldSelf" for r in node["x-kubernetes-validations"])
    spec_rules = [r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert "has(self.prefill) == has(oldSelf.prefill)" in spec_rules


def test_cel_rules_reference_existing_fields(schema: dict[str, Any]) -> None:
    """Catch typos: every self.a.b in a rule and every fieldPath resolves in the schema."""
    for path, node, rule in _rules(schema):
        assert rule["message"] and len(rule["rule"]) < 400, path
        for ref in re.findall(r"(?:self|oldSelf)((?:\.[A-Za-z]+)+)", rule["rule"]):
            target = node
            for part in ref.strip(".").split("."):
                if part in ("size", "matches", "name") and "properties" not in target:
                    break  # metadata and string functions
                target = target["properties"][part]
        if "fieldPath" in rule:
            target = node
            for part in rule["fieldPath"].strip(".").split("."):
                target = target["properties"][part]


def test_committed_crd_matches_models() -> None:
    committed = (ROOT / "crds" / CRD_FILENAME).read_text()
    assert committed == render_crd_yaml(), (
        "crds/ drifted from moe_operator.api: run `moe-operator crds generate`"
    )
    assert yaml.safe_load(committed) == build_crd()


def test_committed_docs_reference_matches_models() -> None:
    for path, text in expected_files(ROOT).items():
        assert path.read_text() == text, f"{path} drifted: run `moe-operator crds generate`"
    reference = (ROOT / DOCS).read_text()
    for field in ("nodesPerReplica", "redundantExperts", "maxMovedExpertsPerRefresh", "measuredBalancedness"):
        assert f"`{field}`" in reference
