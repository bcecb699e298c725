"""Rules about what users put into the engine pods: environment variables, resources."""

from __future__ import annotations

import re

from ..api.spec import MoEDeploymentSpec
from .problem import Problem

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def check_env(spec: MoEDeploymentSpec) -> list[Problem]:
    """Every env entry is a Kubernetes EnvVar with a valid name."""
    problems: list[Problem] = []
    for i, env in enumerate(spec.engine.env):
        name = env.get("name")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            problems.append(
                Problem(
                    f"spec.engine.env[{i}].name",
                    f"spec.engine.env[{i}].name must be an environment variable name (letters, digits, "
                    f"'_', '.', '-', not starting with a digit), got {name!r}; give each entry a name, "
                    "as in {name: NCCL_DEBUG, value: INFO}",
                )
            )
    return problems


def check_resources(spec: MoEDeploymentSpec) -> list[Problem]:
    """The GPU count comes from spec.topology, never from engine.resources."""
    gpu = spec.topology.gpu_resource_name
    resources = spec.engine.resources or {}
    problems: list[Problem] = []
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict) and gpu in values:
            problems.append(
                Problem(
                    f"spec.engine.resources.{section}",
                    f"spec.engine.resources.{section} must not set {gpu}: every engine pod gets all "
                    f"spec.topology.gpusPerNode GPUs of its node; remove it and set gpusPerNode instead",
                )
            )
    return problems
