"""The spec the operator runs: the user's, with the widths the autoscaler applies (docs/autoscaling.md).

With autoscaling.widthChanges Apply the autoscaler chooses a pool's nodesPerReplica and keeps it
in status, so a GitOps tool that owns the spec has nothing to fight over. Every loop that renders,
scales or places reads the same spec through here, and a choice admission would refuse (a tampered
status, a width the rest of the spec does not fit) is not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_operator.api import MoEDeploymentSpec
from moe_operator.autoscale.effective import applied_widths, with_widths
from moe_operator.validation import validate
from moe_operator.validation.platform import PlatformPolicy


def running_spec(
    spec: MoEDeploymentSpec, raw: Mapping[str, Any], status: Mapping[str, Any], platform: PlatformPolicy,
    namespace: str,
) -> MoEDeploymentSpec:  # fmt: skip
    """``spec`` (parsed from ``raw``) at the widths the autoscaler chose, when admission takes them."""
    widths = applied_widths(spec, status)
    chosen = with_widths(raw, widths, lambda r: validate(r, None, platform, namespace))
    return spec if chosen is None else MoEDeploymentSpec.model_validate(chosen)
