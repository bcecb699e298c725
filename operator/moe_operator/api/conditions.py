"""Condition types, reasons and a pure helper to set one condition in a status list.

kstatus-friendly: Ready, plus abnormal-true Progressing/Degraded. Handlers call
``set_condition`` on the dicts they hold and write the result to status.conditions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED)

Status = Literal["True", "False", "Unknown"]


class Reason(StrEnum):
    """CamelCase reasons the operator writes: one vocabulary for conditions, events and alerts.

    Every reason the operator sets is here and nowhere else (code uses the members, never the
    strings); docs/api.md and the Argo CD health check list the same values.
    """

    # Ready / Progressing / Degraded
    ALL_POOLS_READY = "AllPoolsReady"
    POOLS_NOT_READY = "PoolsNotReady"
    SCALED_TO_ZERO = "ScaledToZero"
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    ROLLING_OUT = "RollingOut"
    RECONCILED = "Reconciled"
    GROUP_RESTARTING = "GroupRestarting"
    RESTART_BACKOFF = "RestartBackoff"
    INVALID_SPEC = "InvalidSpec"
    LEADERWORKERSET_NOT_INSTALLED = "LeaderWorkerSetNotInstalled"
    LEADERWORKERSET_NOT_WATCHED = "LeaderWorkerSetNotWatched"
    AS_EXPECTED = "AsExpected"
    TOKEN_SECRET_NOT_OWNED = "TokenSecretNotOwned"
    # events of the expert-placement control loop
    PLACEMENT_PUBLISHED = "PlacementPublished"
    PLACEMENT_ADOPTED = "PlacementAdopted"
    PLACEMENT_REFUSED = "PlacementRefused"
    PLACEMENT_SHAPE_CHANGED = "PlacementShapeChanged"
    # events of the autoscaler (docs/autoscaling.md)
    SCALING_OUT = "ScalingOut"
    SCALED_OUT = "ScaledOut"
    SCALE_OUT_ROLLED_BACK = "ScaleOutRolledBack"
    DRAINING = "Draining"
    DRAIN_CANCELLED = "DrainCancelled"
    SCALED_IN = "ScaledIn"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    WIDTH_DRAINING = "WidthDraining"
    WIDTH_DRAINED = "WidthDrained"
    WIDTH_ROLLED = "WidthRolled"
    WIDTH_ROLL_STUCK = "WidthRollStuck"
    WIDTH_ROLL_WAITING = "WidthRollWaiting"
    WIDTH_GIVEN_UP = "WidthGivenUp"
    SPEC_DRAINING = "SpecDraining"
    SPEC_DRAINED = "SpecDrained"
    SPEC_ROLLED = "SpecRolled"
    SPEC_ROLL_STUCK = "SpecRollStuck"
    SPEC_ROLL_WAITING = "SpecRollWaiting"
    WIDTH_CHOSEN = "WidthChosen"
    WIDER_INSTANCE_RECOMMENDED = "WiderInstanceRecommended"
    # events of the reconciler
    MONITORING_SKIPPED = "MonitoringSkipped"
    COMPUTE_DOMAIN_SKIPPED = "ComputeDomainSkipped"


def _rfc3339(now: datetime) -> str:
    return now.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_`` in a status list, or None."""
    return next((c for c in conditions or () if c.get("type") == type_), None)


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    """Whether the condition of ``type_`` is present and True."""
    found = get_condition(conditions, type_)
    return found is not None and found.get("status") == "True"


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: Status,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Return a new list with ``type_`` set; lastTransitionTime changes only when status does.

    Other conditions keep their order; a new type is appended.
    """
    previous = get_condition(conditions, type_)
    transition = _rfc3339(now)
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        transition = str(previous["lastTransitionTime"])
    updated: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        updated["observedGeneration"] = observed_generation
    result = [dict(c) for c in conditions or () if c.get("type") != type_]
    index = next((i for i, c in enumerate(conditions or ()) if c.get("type") == type_), len(result))
    result.insert(index, updated)
    return result
