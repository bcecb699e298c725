"""The platform policy options shared by the offline commands (crds validate, render, plan), so a
preview admits and refuses exactly what the operator configured with the same policy would."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from moe_operator.api import MoEDeploymentSpec
from moe_operator.validation import PlatformPolicy, PolicyError, validate


def add_policy_args(p: Any, namespace: bool = True) -> None:
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="the platform's limits, as the chart's platform: block or a values file holding one "
        "(default: the operator's safe defaults; policies/platform/examples.yaml grants the examples')",
    )
    if namespace:
        p.add_argument(
            "--namespace",
            "-n",
            default=None,
            help="namespace the MoEDeployment is applied to (default: its metadata.namespace, else "
            "default); platform grants such as hostNetworkNamespaces depend on it",
        )


def load_policy(args: argparse.Namespace) -> PlatformPolicy | None:
    """The policy the options name; None after printing why it cannot be read."""
    try:
        return PlatformPolicy.from_file(args.policy) if args.policy else PlatformPolicy()
    except PolicyError as exc:
        print(f"{args.policy}: {exc}", file=sys.stderr)
        return None


def _refusal_hint(args: argparse.Namespace) -> str:
    """What to add when the spec is refused under the defaults only."""
    return "" if args.policy else " (under the operator's default platform policy: see --policy)"


def admit(args: argparse.Namespace, raw_spec: Any, namespace: str) -> tuple[MoEDeploymentSpec | None, int]:
    """The spec as the webhook would admit it under the options' policy, or None and the exit code
    (2: the policy cannot be read, 1: refused) after printing why."""
    policy = load_policy(args)
    if policy is None:
        return None, 2
    problems = validate(raw_spec, None, policy, namespace)
    for problem in problems:
        print(str(problem) + _refusal_hint(args), file=sys.stderr)
    return (None, 1) if problems else (MoEDeploymentSpec.model_validate(raw_spec), 0)
