"""The recipe's refusals as admission problems: what the pool ends up with cannot start."""

from __future__ import annotations

from ..api.spec import MoEDeploymentSpec
from ..recipe import recipe_findings
from .problem import Problem


def check_recipe(spec: MoEDeploymentSpec) -> list[Problem]:
    """Refusals only; warnings reach the user through the webhook's warnings and the render's --explain."""
    try:
        findings = recipe_findings(spec)
    except ValueError:
        return []  # an inconsistent layout: the pool rules already say what to change
    return [Problem(f.field, f.message) for f in findings if f.severity == "refuse"]


def recipe_warnings(spec: MoEDeploymentSpec) -> list[str]:
    try:
        findings = recipe_findings(spec)
    except ValueError:
        return []
    return [f"{f.field}: {f.message}" for f in findings if f.severity == "warn"]
