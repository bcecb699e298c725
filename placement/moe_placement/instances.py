"""One placement per engine instance: its own windows as the signal, the pool's as a prior.

Replicas of a pool serve the same traffic mix, but each has its own batch: the sequences in
flight on a replica carry over into its next window, so its own recent windows predict its
next one better than the pool's sum does (measured: docs/placement.md, cluster table). The
pool's windows still carry the mix with less noise. Each instance's plan therefore runs the
planner's rolling-origin backtest on the instance's own future with the rules applied to
both histories (forecast.py, ``prior``), and keeps its own guard: per layer, the instance's
own engine EPLB map (DeepSeek on its last window) wherever that scores better, so the
operator never plans a replica worse than its engine would on the planner's own scenarios.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from .layout import FloatArray, as_history
from .planner import Plan, plan


def own_history(
    windows: Iterable[tuple[float, object]], keys: Sequence[int], bucket_s: float, shape: tuple[int, int]
) -> FloatArray:
    """One instance's windows (end time, counts [L, E]) summed on the pool's time buckets [T, L, E]
    (a window ending at t falls in bucket int(t // bucket_s); zero rows where it has none): the one
    rule for the operator and for a runtime planning its own instance, so both plan on the same rows."""
    index = {k: i for i, k in enumerate(keys)}
    out: FloatArray = np.zeros((len(keys), *shape))
    for ended_at, counts in windows:
        i = index.get(int(ended_at // bucket_s))
        if i is not None:
            out[i] += np.asarray(counts, dtype=np.float64)
    return out


def plan_one(
    history: object,
    *,
    num_gpus: int,
    num_nodes: int = 1,
    num_redundant: int = 0,
    num_groups: int = 1,
    prior: object | None = None,
    steps: object | None = None,
    current: np.ndarray | None = None,
    dispatch: str = "static",
    max_moves: int | None = None,
    min_layer_gain: float = 0.0,
    horizon: int | None = None,
) -> Plan:
    """One instance's plan, as plan_instances makes each: wherever it runs (the operator, or the
    instance's own runtime), the same inputs give the same plan."""
    return plan(
        history, num_gpus=num_gpus, num_nodes=num_nodes, num_redundant=num_redundant, num_groups=num_groups,
        current=current, dispatch=dispatch, max_moves=max_moves, min_layer_gain=min_layer_gain,
        horizon=horizon, steps=steps, prior=prior,
    )  # fmt: skip


def plan_instances(
    histories: Mapping[str, object],
    *,
    num_gpus: int,
    num_nodes: int = 1,
    num_redundant: int = 0,
    num_groups: int = 1,
    pool: object | None = None,
    steps: Mapping[str, object | None] | None = None,
    currents: Mapping[str, np.ndarray | None] | None = None,
    dispatch: str = "static",
    max_moves: int | None = None,
    min_layer_gain: float = 0.0,
    horizon: int | None = None,
) -> dict[str, Plan]:
    """A Plan per instance from its own history [T, L, E] (time-aligned rows, newest last).

    ``pool``: the pool's history with the same rows (default: the sum of all instances);
    ``steps``/``currents``: per instance, optional single-step samples and current map;
    ``max_moves`` caps each instance's moves.
    """
    if not histories:
        raise ValueError("histories must name at least one instance")
    own = {name: as_history(h) for name, h in histories.items()}
    shapes = {h.shape for h in own.values()}
    if len(shapes) != 1:
        raise ValueError(f"every instance's history must have the same shape [T, L, E], got {sorted(shapes)}")
    prior = np.sum(list(own.values()), axis=0) if pool is None else as_history(pool)
    out = {}
    for name, history in own.items():
        out[name] = plan_one(
            history,
            num_gpus=num_gpus,
            num_nodes=num_nodes,
            num_redundant=num_redundant,
            num_groups=num_groups,
            current=None if currents is None else currents.get(name),
            dispatch=dispatch,
            max_moves=max_moves,
            min_layer_gain=min_layer_gain,
            horizon=horizon,
            steps=None if steps is None else steps.get(name),
            prior=prior if len(own) > 1 or pool is not None else None,
        )
    return out
