"""Render the field reference of docs/api.md from the CRD schema (so docs cannot drift)."""

from __future__ import annotations

from typing import Any

from .structural import JsonSchema

BEGIN = "<!-- BEGIN GENERATED REFERENCE (moe-operator crds generate) -->"
END = "<!-- END GENERATED REFERENCE -->"


def _type(node: JsonSchema) -> str:
    if node.get("x-kubernetes-int-or-string"):
        kind = "int or string"
    elif node.get("type") == "array":
        kind = f"list of {_type(node.get('items', {}))}"
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        kind = f"map of {_type(node['additionalProperties'])}"
    elif node.get("type") == "object" and node.get("x-kubernetes-preserve-unknown-fields"):
        kind = "Kubernetes object"
    else:
        kind = str(node.get("type", "any"))
    return kind


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _objects(path: str, node: JsonSchema) -> list[tuple[str, JsonSchema]]:
    """Every object with named fields under ``node``, depth first, in schema order."""
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        target = sub.get("items", sub) if sub.get("type") == "array" else sub
        if target.get("properties"):
            found.extend(_objects(f"{path}.{name}" + ("[]" if target is not sub else ""), target))
    return found


def render_reference(schema: JsonSchema) -> str:
    """Markdown tables, one per object: field, type, description (with values, range, default)."""
    lines: list[str] = []
    for section in ("spec", "status"):
        for path, node in _objects(section, schema["properties"][section]):
            lines += [f"### `{path}`", "", _cell(node.get("description", "")), ""]
            lines += ["| Field | Type | Description |", "| --- | --- | --- |"]
            required = set(node.get("required", []))
            for name, sub in node["properties"].items():
                kind = _type(sub) + (", required" if name in required else "")
                lines.append(f"| `{name}` | {kind} | {_cell(sub.get('description', ''))} |")
            rules = node.get("x-kubernetes-validations", [])
            if rules:
                lines += ["", "Rules the apiserver enforces here:", ""]
                lines += [f"- `{r['rule']}`: {_cell(r['message'])}" for r in rules]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def splice(document: str, reference: str) -> str:
    """Replace the generated block of ``document`` (between the markers) with ``reference``."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        return document.rstrip() + f"\n\n{BEGIN}\n\n{reference}\n{END}\n"
    return document[: start + len(BEGIN)] + f"\n\n{reference}\n" + document[end:]


def reference_of(crd: dict[str, Any]) -> str:
    """The reference for the first (storage) version of a CRD dict."""
    schema: JsonSchema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return render_reference(schema)
