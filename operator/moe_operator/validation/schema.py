"""Schema-level checks: parse the spec with the pydantic models and explain each error.

The apiserver enforces the same bounds from the CRD; this keeps admission (and the CLI,
and tests without an apiserver) equally strict, with messages that say how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..api.spec import MoEDeploymentSpec
from .problem import Problem

# Union branch tags pydantic appends to error locations (int | str quantities).
_BRANCH_TAGS = {"int", "str", "constrained-str", "float", "bool"}

_PATTERN_HINTS = {
    "gpuMemory": "use a Kubernetes quantity such as 80Gi or 141Gi",
    "sharedMemorySize": "use a Kubernetes quantity such as 64Gi",
    "totalParameters": "use an integer or a number with K, M, B or T, such as 671B",
    "activeParameters": "use an integer or a number with K, M, B or T, such as 37B",
    "path": "use an absolute path such as /models/dsv3",
    "nvlinkDomainLabel": "use a Kubernetes label key such as nvidia.com/gpu.clique",
    "rackLabel": "use a Kubernetes label key such as topology.kubernetes.io/zone",
    "ibDevices": "use an RDMA device name such as mlx5_0",
}
_DURATION_FIELDS = {
    "refreshInterval", "minInterval", "history", "alertFor", "startupTimeout", "bootTime",
    "scaleOutCooldown", "scaleInCooldown", "scaleInWindow", "drainTimeout", "burstMemory", "ttft", "itl",
}  # fmt: skip


def field_path(loc: Sequence[int | str], prefix: str = "spec") -> str:
    """A JSON path like spec.engine.extraArgs[2] from a pydantic error location."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _BRANCH_TAGS or "[" in part:
            continue
        else:
            path += f".{part}"
    return path


def _fix(error: ErrorDetails, name: str) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "missing":
        return "add it"
    if kind == "extra_forbidden":
        return "remove it or fix its spelling (see `kubectl explain moedeployment.spec`)"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return "change the value to fit that bound"
    if kind == "duration_range":  # api.types.DurationRange; the CRD's CEL rule says the same
        return "`kubectl explain` shows why the field is bounded"
    if kind == "literal_error":
        return f"use one of {ctx.get('expected', 'the allowed values')}"
    if kind == "string_pattern_mismatch":
        if name in _DURATION_FIELDS:
            return "use a duration made of ms, s, m and h parts, such as 5m or 1h30m"
        return _PATTERN_HINTS.get(name, "change the value to match that pattern")
    if kind in ("too_long", "string_too_long"):
        return "shorten it"
    if kind in ("too_short", "string_too_short"):
        return "give a value"
    return "give a value of the right type"


def parse_spec(spec: Mapping[str, Any]) -> tuple[MoEDeploymentSpec | None, list[Problem]]:
    """The parsed spec, or None and one problem per distinct schema error."""
    try:
        return MoEDeploymentSpec.model_validate(dict(spec)), []
    except ValidationError as exc:
        problems: dict[str, Problem] = {}
        for error in exc.errors():
            path = field_path(error["loc"])
            names = [p for p in error["loc"] if isinstance(p, str) and p not in _BRANCH_TAGS]
            name = names[-1] if names else ""
            detail = error["msg"][:1].lower() + error["msg"][1:]
            if error["type"] == "value_error":  # our own validators: the message already says the fix
                problems[path] = Problem(path, f"{path}: {detail.removeprefix('value error, ')}")
                continue
            # int-or-string fields fail once per branch: the last (string) branch explains best
            problems[path] = Problem(path, f"{path}: {detail}; {_fix(error, name)}")
        return None, list(problems.values())
