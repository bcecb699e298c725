"""Score placements honestly: fit on the past, measure on the future, per step and per layer.

At every rebalance point t (every ``window`` steps after a warm-up) a planner sees only the
steps before t, and its map is scored on each step of [t, t + window). The baseline is run
as engines run it: on the sum of the last window. Excess imbalance is the mean over steps
and layers of max/mean - 1 (SGLang computes balancedness per forward pass, too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .layout import FloatArray, IntArray
from .metrics import gpu_loads, imbalance

# (history [t, L, E], previous map or None, rebalance index) -> map [L, P]
Planner = Callable[[FloatArray, "IntArray | None", int], IntArray]


@dataclass(frozen=True)
class Score:
    """Future imbalance and movement of one planner over a trace."""

    excess: float  # mean over steps and layers of max/mean - 1
    p95: float  # 95th percentile of max/mean
    moved: int  # slots changed between consecutive plans (the first plan is free)
    moves: tuple[int, ...]  # per rebalance (0 for the first)


def rebalance_points(num_steps: int, window: int, warmup: int) -> list[int]:
    """Steps at which a plan is made: warmup, warmup + window, ... each with a full window after."""
    return list(range(warmup, num_steps - window + 1, window))


def rolling_plans(counts: FloatArray, planner: Planner, *, window: int, warmup: int) -> list[IntArray]:
    """The planner's map at each rebalance point, given the history so far and its previous map."""
    maps: list[IntArray] = []
    for k, t in enumerate(rebalance_points(counts.shape[0], window, warmup)):
        maps.append(planner(counts[:t], maps[-1] if maps else None, k))
    return maps


def score_plans(
    counts: FloatArray,
    maps: list[IntArray],
    *,
    window: int,
    warmup: int,
    num_gpus: int,
    num_nodes: int = 1,
    dispatch: str = "dynamic",
) -> Score:
    """Per-step, per-layer max/mean of each map on the window that follows it."""
    ratios = []
    moves = []
    for k, t in enumerate(rebalance_points(counts.shape[0], window, warmup)):
        load = gpu_loads(maps[k], counts[t : t + window], num_gpus, dispatch, num_nodes)
        ratios.append(imbalance(load).ravel())
        moves.append(0 if k == 0 else int(np.count_nonzero(maps[k] != maps[k - 1])))
    flat = np.concatenate(ratios)
    return Score(float(flat.mean() - 1.0), float(np.percentile(flat, 95)), int(sum(moves)), tuple(moves))
