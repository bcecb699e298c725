"""Start-up phases of instances on their way up (pure): the runtime's answer read as untrusted
input, and what status shows of it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from moe_contract.startup import START_PHASES
from moe_operator.lifecycle import GroupState, StartReport, is_ready

MAX_PHASE_AGE_S = 30 * 24 * 3600.0
"""A leader's "since" beyond this is nonsense (a pod does not start for a month): ignored."""


def start_report(status: Mapping[str, Any], observed: datetime) -> StartReport | None:
    """The ``start`` of a runtime's GET /v1/status, or None when absent or malformed (a hostile or
    broken runtime gets no say: its group is judged on the plain allowance)."""
    start = status.get("start")
    if not isinstance(start, Mapping):
        return None
    phase, since = start.get("phase"), start.get("since")
    if phase not in START_PHASES or isinstance(since, bool) or not isinstance(since, int | float):
        return None
    if not math.isfinite(since) or not 0 <= since <= MAX_PHASE_AGE_S:
        return None
    entered = observed - timedelta(seconds=float(since))
    # The runtime's own timestamp of the phase, when sane, is stable from one poll to the next.
    stamp = (start.get("phases") or {}).get(phase) if isinstance(start.get("phases"), Mapping) else None
    if isinstance(stamp, int | float) and not isinstance(stamp, bool) and math.isfinite(stamp):
        at = datetime.fromtimestamp(float(stamp), tz=observed.tzinfo) if abs(
            observed.timestamp() - float(stamp) - float(since)) < 60 else None  # fmt: skip
        entered = at or entered
    return StartReport(str(phase), entered.replace(microsecond=0))


def starting(groups: Sequence[GroupState], pool: str) -> list[dict[str, Any]]:
    """status.pools.<pool>.starting: the pool's unready instances with the phase their leader reported
    (phaseSince to the second, so a reconcile writes status only when a phase changes)."""
    out = []
    for g in sorted((g for g in groups if g.pool == pool and not is_ready(g)), key=lambda g: g.index):
        entry: dict[str, Any] = {"instance": g.index, "phase": g.start.phase if g.start else "launching"}
        if g.start is not None:
            entry["phaseSince"] = g.start.entered.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append(entry)
    return out
