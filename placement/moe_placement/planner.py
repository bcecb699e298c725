"""The planner's entry point: validate, forecast, place, then respect the current placement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .forecast import forecast
from .fresh import fresh_placement
from .layout import BoolArray, FloatArray, IntArray, as_history, check_dispatch, check_placement, make_layout
from .metrics import balancedness
from .movement import respect_current


@dataclass(frozen=True)
class Plan:
    """A placement in SGLang's layout plus what the planner expects of it."""

    physical_to_logical_map: IntArray  # [L, E + R]; GPU g holds slots g*S .. g*S + S - 1
    predicted_balancedness: FloatArray  # [L], mean/max GPU load on the predicted next window
    moved_slots: int  # slots whose expert differs from `current` (0 without one)
    changed_layers: BoolArray  # [L]


def plan(
    loads: object,
    *,
    num_gpus: int,
    num_nodes: int = 1,
    num_redundant: int = 0,
    num_groups: int = 1,
    current: np.ndarray | None = None,
    dispatch: str = "static",
    max_moves: int | None = None,
    min_layer_gain: float = 0.0,
    horizon: int | None = None,
) -> Plan:
    """Plan expert placement for the next window from a history of loads [T, L, E] (newest last).

    ``horizon``: steps the plan is expected to serve (default: an eighth of the history; give it about eight windows).
    With ``current``, layers move only as far as pays (see movement.py); ``max_moves`` caps
    the moved slots over all layers and ``min_layer_gain`` is the relative predicted gain
    a layer needs before it changes at all.
    """
    history = as_history(loads)
    layout = make_layout(
        history.shape[1],
        history.shape[2],
        num_gpus=num_gpus,
        num_nodes=num_nodes,
        num_redundant=num_redundant,
        num_groups=num_groups,
    )
    check_dispatch(dispatch)
    cur = None if current is None else check_placement(current, layout)
    if max_moves is not None and (
        isinstance(max_moves, bool) or int(max_moves) != max_moves or max_moves < 0
    ):
        raise ValueError(f"max_moves must be a non-negative integer or None, got {max_moves!r}")
    if not np.isfinite(min_layer_gain) or min_layer_gain < 0:
        raise ValueError(f"min_layer_gain must be >= 0, got {min_layer_gain!r}")
    if horizon is not None and (isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1):
        raise ValueError(f"horizon must be a positive integer or None, got {horizon!r}")
    fc = forecast(history, horizon=horizon)
    phy2log = fresh_placement(fc, layout, dispatch)
    if cur is None:
        changed = np.ones(layout.num_layers, dtype=bool)
        moved = 0
    else:
        phy2log, changed = respect_current(phy2log, cur, fc, layout, dispatch, max_moves, min_layer_gain)
        moved = int((phy2log != cur).sum())
    predicted = balancedness(phy2log, fc.mean, num_gpus, dispatch, num_nodes=num_nodes)
    return Plan(phy2log.astype(np.int64), predicted, moved, changed)
