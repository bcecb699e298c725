"""One evaluation of a pool: history -> plan -> scores -> decision. Pure; the shell does the I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moe_contract.engine import EplbMode
from moe_operator.control import aggregate, score
from moe_operator.control.decide import Decision, Inputs, decide
from moe_operator.control.windows import Window
from moe_placement import plan
from moe_placement.maps import map_problems


class NoFreshWindows(ValueError):
    """No instance reported a load window recently: nothing to score the current placement on."""


class UnsafePlan(ValueError):
    """The planner produced a map the engine must not apply; it is not published."""


@dataclass(frozen=True)
class PoolShape:
    """What the planner needs to know of a pool (its EP world and the model)."""

    num_layers: int  # num_hidden_layers, dense layers included (the windows' rows)
    num_experts: int
    num_redundant: int
    num_gpus: int  # EP size
    num_nodes: int
    num_groups: int
    dispatch: str

    @property
    def num_slots(self) -> int:
        return self.num_experts + self.num_redundant

    def problems(self, phy2log: object) -> list[str]:
        """Why a map must not be published for this pool (empty when it is safe)."""
        return map_problems(
            phy2log,  # type: ignore[arg-type]
            num_layers=self.num_layers,
            num_logical=self.num_experts,
            num_physical=self.num_slots,
            num_gpus=self.num_gpus,
        )


@dataclass(frozen=True)
class Policy:
    mode: EplbMode
    min_improvement: float
    max_moves: int
    min_interval_s: float
    bucket_s: float
    paused: str = ""  # see decide.Inputs.paused
    rolling: str = ""  # see decide.Inputs.rolling


@dataclass(frozen=True)
class Evaluation:
    decision: Decision
    candidate: np.ndarray | None  # the planned map (None when planning failed)
    measured: float
    predicted: float
    moved: int
    instances: list[str]
    window_range: tuple[int, int]
    history_buckets: int = 0  # time buckets the plan used
    restored_buckets: int = 0  # of which restored from before an operator restart


def _inputs(policy: Policy, measured: float, predicted: float, moved: int, since: float | None) -> Inputs:
    return Inputs(
        mode=policy.mode,
        measured=measured,
        predicted=predicted,
        moved=moved,
        min_improvement=policy.min_improvement,
        max_moves=policy.max_moves,
        min_interval_s=policy.min_interval_s,
        since_last_publish_s=since,
        paused=policy.paused,
        rolling=policy.rolling,
    )


def evaluate(
    windows: Sequence[Window],
    current: np.ndarray,
    shape: PoolShape,
    policy: Policy,
    since_last_publish_s: float | None,
    fresh_after: float,
) -> Evaluation:
    """Plan against ``current`` and decide. Raises NoFreshWindows, UnsafePlan or ValueError (bad input).

    The current placement is scored on each instance's newest window ending after
    ``fresh_after`` (a runtime that went quiet does not vote); the plan uses all history,
    restored buckets included.
    """
    fresh = [w for w in windows if w.ended_at >= fresh_after and not w.restored]
    if not fresh:
        raise NoFreshWindows("no fresh load windows from any instance")
    recent, instances, window_range = aggregate.latest(fresh)
    measured = score.measured(current, recent, shape.num_gpus, shape.num_nodes, shape.dispatch)
    keys, history = aggregate.bucketed(windows, policy.bucket_s)
    restored = {int(w.ended_at // policy.bucket_s) for w in windows if w.restored}
    result = plan(
        history,
        num_gpus=shape.num_gpus,
        num_nodes=shape.num_nodes,
        num_redundant=shape.num_redundant,
        num_groups=shape.num_groups,
        current=current,
        dispatch=shape.dispatch,
        max_moves=policy.max_moves or None,
    )
    candidate = result.physical_to_logical_map
    bad = shape.problems(candidate)
    if bad:
        raise UnsafePlan("the planner's map is unsafe, not published: " + "; ".join(bad[:3]))
    predicted = score.mean_over_moe(result.predicted_balancedness, recent)
    decision = decide(_inputs(policy, measured, predicted, result.moved_slots, since_last_publish_s))
    return Evaluation(
        decision,
        candidate,
        measured,
        predicted,
        result.moved_slots,
        instances,
        window_range,
        history_buckets=len(keys),
        restored_buckets=len(restored.intersection(keys)),
    )
