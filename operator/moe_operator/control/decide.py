"""Whether to publish a new placement: gain threshold, rate limit, move cap, mode.

Every "no" carries a reason (a metric label) and a message (status and events), so a
placement that did not change always says why.
"""

from __future__ import annotations

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
