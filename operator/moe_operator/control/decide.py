"""Whether to publish a new placement: gain threshold, rate limit, move cap, mode.

Every "no" carries a reason (a metric label) and a message (status and events), so a
placement that did not change always says why.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from moe_contract.engine import EplbMode


@dataclass(frozen=True)
class Inputs:
    mode: EplbMode
    measured: float  # current placement on the newest windows
    predicted: float  # candidate placement, as the planner predicts it
    moved: int  # slots the candidate changes
    min_improvement: float
    max_moves: int  # 0: no cap
    min_interval_s: float
    since_last_publish_s: float | None  # None: never published
    paused: str = ""  # why automatic placement is paused (a rollback); empty: not paused
    # mode static: which instances still boot an older placement than the live one (a roll onto it
    # is under way); empty: every instance runs it
    rolling: str = ""


@dataclass(frozen=True)
class Decision:
    publish: bool  # write a new ConfigMap version
    push: bool  # PUT it to the runtimes (online apply)
    reason: str  # short, for metrics
    message: str  # for status and events


def decide(i: Inputs) -> Decision:
    gain = i.predicted - i.measured
    numbers = f"measured {i.measured:.3f}, predicted {i.predicted:.3f} (gain {gain:+.3f})"
    if i.mode == "off":
        return Decision(False, False, "off", "eplb mode off: nothing to do")
    if i.mode == "engine":
        return Decision(False, False, "observe", f"eplb mode engine: observing only; {numbers}")
    if i.paused:
        return Decision(False, False, "paused", f"automatic placement paused ({i.paused}); {numbers}")
    if i.mode == "static" and i.rolling:
        return Decision(
            False, False, "rolling",
            f"the pool still rolls onto the live placement ({i.rolling}): a new one waits until every "
            f"instance runs it; {numbers}",
        )  # fmt: skip
    if i.moved == 0:
        return Decision(False, False, "unchanged", f"the planner keeps the current placement; {numbers}")
    if gain < i.min_improvement:
        return Decision(
            False, False, "small_gain", f"gain below minImprovement {i.min_improvement}; {numbers}"
        )
    if i.max_moves and i.moved > i.max_moves:
        return Decision(
            False, False, "too_many_moves", f"{i.moved} moved slots > cap {i.max_moves}; {numbers}"
        )
    if i.since_last_publish_s is not None and i.since_last_publish_s < i.min_interval_s:
        wait = i.min_interval_s - i.since_last_publish_s
        return Decision(
            False, False, "min_interval", f"minInterval not elapsed ({wait:.0f}s left); {numbers}"
        )
    push = i.mode == "operator"
    how = "pushed to the runtimes" if push else "applied when groups restart"
    return Decision(True, push, "published", f"new placement, {i.moved} slots moved, {how}; {numbers}")


def static_roll(live_version: int, boots: Mapping[str, str], outdated: Collection[int] = ()) -> str:
    """Mode static: what of the pool still rolls, for Inputs.rolling: the instances (leader pod name ->
    the placement version it booted with) not on ``live_version`` yet, and the instances the
    reconciler lists as running an older pod template (``outdated``: a placement, width or spec roll
    under way, a leader pod being replaced included).

    Every published placement is a new pod template that rolls the pool one instance at a time,
    drained, at one instance fewer; publishing again before that roll ends restarts it, and a pool
    that rolls longer than minInterval would roll without end. Nothing published yet: no version
    to be behind."""
    behind = sorted(n for n, boot in boots.items() if boot != str(live_version)) if live_version > 0 else []
    parts = []
    if behind:
        names = ", ".join(behind[:3]) + (f" and {len(behind) - 3} more" if len(behind) > 3 else "")
        parts.append(
            f"{len(behind)} of {len(boots)} instance(s) boot an older placement than v{live_version}: {names}"
        )
    if outdated:
        shown = sorted(outdated)
        more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        parts.append(f"instance(s) {shown[:5]}{more} run an older pod template")
    return "; ".join(parts)
