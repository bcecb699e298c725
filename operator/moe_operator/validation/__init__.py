"""Admission rules for MoEDeployment specs (pure: dicts in, problems out).

``validate`` runs every rule the CRD's schema and CEL rules enforce, plus the ones that
need the model catalog or arithmetic (memory fit, expert slots, NVLink domains), plus what
the platform allows tenants (model volume sources, env references, tolerations, host
network: validation.platform), so the webhook, the reconciler, the CLI and tests all refuse
the same specs with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.spec import MoEDeploymentSpec
from .arg_rules import check_extra_args
from .autoscaling_rules import autoscaling_warnings, check_autoscaling
from .consistency_rules import check_eplb, check_ports
from .memory_rules import check_gpu_memory, check_memory
from .model_rules import check_model
from .platform import DEFAULT_POLICY, PlatformPolicy, PolicyError
from .pod_rules import (
    check_env,
    check_host_network,
    check_kernel_cache,
    check_model_volume,
    check_resources,
    check_tolerations,
)
from .pool_rules import check_attention, check_backend, check_expert_slots, check_topology
from .problem import Problem
from .recipe_rules import check_recipe, recipe_warnings
from .schema import parse_spec
from .update_rules import check_update, update_warnings


@dataclass(frozen=True)
class Tenancy:
    """Where a spec is admitted: the platform's policy (None: no platform limits) and the namespace."""

    policy: PlatformPolicy | None
    namespace: str | None


Rule = Callable[[MoEDeploymentSpec, Tenancy], list[Problem]]


def _spec_only(check: Callable[[MoEDeploymentSpec], list[Problem]]) -> Rule:
    def rule(spec: MoEDeploymentSpec, _: Tenancy) -> list[Problem]:
        return check(spec)

    rule.__name__ = check.__name__
    return rule


def _platform(check: Callable[[MoEDeploymentSpec, PlatformPolicy], list[Problem]]) -> Rule:
    def rule(spec: MoEDeploymentSpec, where: Tenancy) -> list[Problem]:
        return [] if where.policy is None else check(spec, where.policy)

    rule.__name__ = check.__name__
    return rule


def _env(spec: MoEDeploymentSpec, where: Tenancy) -> list[Problem]:
    return check_env(spec, where.policy)


def _host_network(spec: MoEDeploymentSpec, where: Tenancy) -> list[Problem]:
    return [] if where.policy is None else check_host_network(spec, where.policy, where.namespace)


RULES: tuple[Rule, ...] = (
    _spec_only(check_model),
    _platform(check_model_volume),
    _platform(check_kernel_cache),
    _spec_only(check_gpu_memory),
    _spec_only(check_topology),
    _spec_only(check_attention),
    _spec_only(check_backend),
    _spec_only(check_expert_slots),
    _spec_only(check_memory),
    _spec_only(check_extra_args),
    _env,
    _spec_only(check_resources),
    _platform(check_tolerations),
    _host_network,
    _spec_only(check_ports),
    _spec_only(check_eplb),
    _spec_only(check_recipe),
    _spec_only(check_autoscaling),
)


def validate(
    spec: Mapping[str, Any],
    old_spec: Mapping[str, Any] | None = None,
    policy: PlatformPolicy | None = DEFAULT_POLICY,
    namespace: str | None = None,
) -> list[Problem]:
    """Every reason to refuse ``spec`` (an update of ``old_spec`` when given) in ``namespace`` under
    the platform's ``policy`` (default: the safe defaults); empty means admit.

    ``policy=None`` leaves out what the platform grants (volume sources, env references,
    tolerations, host network): for offline tools that admit nothing, such as planning.
    """
    problems = check_update(spec, old_spec) if old_spec is not None else []
    parsed, schema_problems = parse_spec(spec)
    if parsed is None:
        return [*problems, *schema_problems]
    where = Tenancy(policy, namespace)
    for rule in RULES:
        problems.extend(rule(parsed, where))
    return _unique(problems)


def warnings(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None = None) -> list[str]:
    """What admits but loses throughput or service, each with its fix (admission warnings, render
    --explain); ``old_spec``: the spec an update replaces."""
    parsed, _ = parse_spec(spec)
    changes = update_warnings(spec, old_spec) if old_spec is not None else []
    return changes + ([] if parsed is None else recipe_warnings(parsed) + autoscaling_warnings(parsed))


def _unique(problems: list[Problem]) -> list[Problem]:
    """Drop repeats (two rules may spot the same thing), keeping the first order."""
    return list(dict.fromkeys(problems))


__all__ = ["RULES", "PlatformPolicy", "PolicyError", "Problem", "Tenancy", "validate", "warnings"]
