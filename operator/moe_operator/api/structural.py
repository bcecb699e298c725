"""Turn pydantic's JSON Schema into a structural OpenAPI schema the apiserver accepts.

The apiserver insists on: every node typed, no $ref/$defs (inlined), Optional as
``nullable: true`` rather than anyOf-with-null, maps as additionalProperties (no
patternProperties/propertyNames), int-or-string only in its restricted anyOf form.
Descriptions get the allowed values, bounds and default appended, because
`kubectl explain` shows descriptions, not those keywords.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

JsonSchema = dict[str, Any]

_DROP = ("title", "propertyNames", "patternProperties", "$defs")


def structural(schema: Mapping[str, Any], defaults: bool = True) -> JsonSchema:
    """Inline and normalise a pydantic ``model_json_schema(by_alias=True)`` result.

    ``defaults=False`` drops every default (status: only the operator writes it, and the
    apiserver should not invent values there).
    """
    defs: Mapping[str, Any] = schema.get("$defs", {})
    converted = _convert(schema, defs)
    if not defaults:
        _drop_defaults(converted)
    return _annotate_tree(converted)


def _drop_defaults(node: JsonSchema) -> None:
    node.pop("default", None)
    for sub in node.get("properties", {}).values():
        _drop_defaults(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _drop_defaults(node[key])


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any]) -> JsonSchema:
    node = dict(node)
    if "$ref" in node:
        return _ordered(_merge(_convert(defs[node.pop("$ref").rsplit("/", 1)[-1]], defs), node, defs))
    if "allOf" in node and len(node["allOf"]) == 1:
        return _ordered(_merge(_convert(node.pop("allOf")[0], defs), node, defs))
    if "anyOf" in node:
        options = node["anyOf"]
        others = [o for o in options if o.get("type") != "null"]
        if len(others) < len(options):
            node.pop("anyOf")
            if node.get("default", 0) is None:
                node.pop("default")
            inner = others[0] if len(others) == 1 else {"anyOf": others}
            merged = _merge(_convert(inner, defs), node, defs)
            merged["nullable"] = True
            return _ordered(merged)
    out: JsonSchema = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, Mapping):  # `false` (extra=forbid) is implied by pruning
                out[key] = _convert(value, defs)
        else:
            out[key] = value
    patterns = node.get("patternProperties")
    if patterns:  # a dict with constrained keys: keys are checked by admission, values here
        out["additionalProperties"] = _convert(next(iter(patterns.values())), defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out.setdefault("x-kubernetes-preserve-unknown-fields", True)
    return _ordered(out)


_FIRST = ("type", "description", "format", "enum", "default", "nullable")


def _ordered(node: JsonSchema) -> JsonSchema:
    """Readable key order in the YAML: type and description first."""
    head = {k: node[k] for k in _FIRST if k in node}
    return {**head, **{k: v for k, v in node.items() if k not in head}}


def _merge(base: JsonSchema, siblings: Mapping[str, Any], defs: Mapping[str, Any]) -> JsonSchema:
    """A field's own keys win over its type's (description, default); CEL rules accumulate."""
    result = dict(base)
    for key, value in _convert(siblings, defs).items():
        if key == "x-kubernetes-validations":
            result[key] = [*result.get(key, []), *value]
        else:
            result[key] = value
    return result


def _annotate_tree(node: JsonSchema) -> JsonSchema:
    for sub in node.get("properties", {}).values():
        _annotate(sub)
        _annotate_tree(sub)
    if isinstance(node.get("items"), dict):
        _annotate_tree(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        _annotate_tree(node["additionalProperties"])
    return node


def _annotate(node: JsonSchema) -> None:
    facts: list[str] = []
    if "enum" in node:
        facts.append("One of: " + ", ".join(str(v) for v in node["enum"]) + ".")
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        facts.append(f"Range: {_fmt(low)} to {_fmt(high)}.")
    elif low is not None:
        facts.append(f"At least {_fmt(low)}.")
    if "maxItems" in node:
        facts.append(f"At most {node['maxItems']} items.")
    if "maxProperties" in node:
        facts.append(f"At most {node['maxProperties']} entries.")
    if "default" in node and node["default"] != {}:
        facts.append(f"Default: {_fmt(node['default'])}.")
    if facts and node.get("description"):
        node["description"] = node["description"].rstrip() + " " + " ".join(facts)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or '""'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)
