"""Admission rules for MoEDeployment specs (pure: dicts in, problems out).

``validate`` runs every rule the CRD's schema and CEL rules enforce, plus the ones that
need the model catalog or arithmetic (memory fit, expert slots, NVLink domains), so a
webhook, the CLI and tests all refuse the same specs with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..api.spec import MoEDeploymentSpec
from .arg_rules import check_extra_args
from .consistency_rules import check_eplb, check_ports
from .memory_rules import check_gpu_memory, check_memory
from .model_rules import check_model
from .pod_rules import check_env, check_resources
from .pool_rules import check_attention, check_backend, check_expert_slots, check_topology
from .problem import Problem
from .schema import parse_spec
from .update_rules import check_update

Rule = Callable[[MoEDeploymentSpec], list[Problem]]

RULES: tuple[Rule, ...] = (
    check_model,
    check_gpu_memory,
    check_topology,
    check_attention,
    check_backend,
    check_expert_slots,
    check_memory,
    check_extra_args,
    check_env,
    check_resources,
    check_ports,
    check_eplb,
)


def validate(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None = None) -> list[Problem]:
    """Every reason to refuse ``spec`` (an update of ``old_spec`` when given); empty means admit."""
    problems = check_update(spec, old_spec) if old_spec is not None else []
    parsed, schema_problems = parse_spec(spec)
    if parsed is None:
        return [*problems, *schema_problems]
    for rule in RULES:
        problems.extend(rule(parsed))
    return _unique(problems)


def _unique(problems: list[Problem]) -> list[Problem]:
    """Drop repeats (two rules may spot the same thing), keeping the first order."""
    return list(dict.fromkeys(problems))


__all__ = ["RULES", "Problem", "validate"]
