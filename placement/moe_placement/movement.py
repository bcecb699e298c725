"""Decide, layer by layer, how far to move from the current placement.

Four candidates per layer: keep it, improve it in place with few moves (incremental),
re-pack it toward the forecast's copy counts within an even share of the budget (guided),
or take the fresh plan relabelled to share as many slots as possible with it (matching).
They are compared on the forecast scenarios under the real dispatch rule; a layer changes
only when its predicted gain clears ``min_layer_gain`` (hysteresis: small gains are not
worth the weight transfers and the stall), and all layers together stay within
``max_moves`` moved slots.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .forecast import Forecast
from .guided import guided_rows
from .incremental import improve
from .layout import BoolArray, FloatArray, IntArray, Layout
from .matching import match_to_current
from .metrics import gpu_loads, imbalance
from .packing import Bins

TIE = 1e-3  # relative objective difference treated as a tie (then fewer moves wins)


def expected_imbalance(phy2log: IntArray, fc: Forecast, layout: Layout, dispatch: str) -> FloatArray:
    """Mean over forecast scenarios of max/mean GPU load, per layer [L]."""
    loads = gpu_loads(phy2log, fc.scenarios, layout.num_gpus, dispatch, layout.num_nodes)
    out: FloatArray = imbalance(loads).mean(axis=0)
    return out


def respect_current(
    fresh: IntArray,
    current: IntArray,
    fc: Forecast,
    layout: Layout,
    dispatch: str,
    max_moves: int | None,
    min_layer_gain: float,
) -> tuple[IntArray, BoolArray]:
    """Final map [L, P] and which layers changed."""
    incremental = improve_current(current, fc, layout, dispatch, max_moves)
    rows = layout.num_layers * (layout.num_nodes if layout.hierarchical else 1)
    share = None if max_moves is None else max_moves // rows  # guided_rows budgets each row
    guided = current  # with one slot per GPU, incremental already exchanges copies exactly
    if layout.slots_per_gpu > 1:
        guided = improve_current(current, fc, layout, dispatch, share, solver=guided_rows)
    matched = match_to_current(fresh, current, layout, dispatch)
    options = np.stack([current, incremental, guided, matched])  # [4, L, P]
    obj = np.stack([expected_imbalance(m, fc, layout, dispatch) for m in options])  # [4, L]
    cost = (options != current[None]).sum(axis=2).astype(float)
    layers = np.arange(layout.num_layers)
    if max_moves is None:
        near_best = obj <= obj.min(axis=0, keepdims=True) * (1 + TIE)
        choice = np.argmin(np.where(near_best, cost, np.inf), axis=0)
    else:
        choice = np.where(obj[1] < obj[0], 1, 0)
        spent = float(cost[choice, layers].sum())
        # upgrades (layer, option), best gain per extra move first, against the first choice
        opts = np.array([2, 3])
        gain = obj[choice, layers][None, :] - obj[opts]  # [2, L]
        extra = cost[opts] - cost[choice, layers][None, :]
        order = np.argsort(-(gain / np.maximum(extra, 1.0)).ravel(), kind="stable")
        for k in order:
            o, layer = opts[k // layout.num_layers], k % layout.num_layers
            more = cost[o, layer] - cost[choice[layer], layer]
            if obj[o, layer] < obj[choice[layer], layer] and spent + more <= max_moves:
                spent += more
                choice[layer] = o
    base = obj[0]
    rel_gain = (base - obj[choice, layers]) / np.maximum(base, 1e-300)
    keep = (rel_gain < min_layer_gain) | (rel_gain <= 0)
    choice = np.where(keep, 0, choice)
    final = options[choice, layers]
    return final, (final != current).any(axis=1)


RowSolver = Callable[[IntArray, FloatArray, FloatArray, Bins, "int | None"], IntArray]


def improve_current(
    current: IntArray,
    fc: Forecast,
    layout: Layout,
    dispatch: str,
    budget: int | None,
    solver: RowSolver = improve,
) -> IntArray:
    """Improve ``current`` with ``solver`` (on rows of GPUs) within the placement rules (see placement.py)."""
    num_layers = layout.num_layers
    mean, scen = fc.mean, fc.scenarios.transpose(1, 0, 2)
    slots, per_node, nodes = layout.slots_per_gpu, layout.gpus_per_node, layout.num_nodes
    if not layout.hierarchical:
        by_node = dispatch == "static" and nodes > 1
        domain = np.arange(layout.num_gpus) // per_node if by_node else np.arange(layout.num_gpus)
        state = current.reshape(num_layers, layout.num_gpus, slots)
        out = solver(state, scen, mean, Bins(layout.num_gpus, slots, domain), budget)
        return out.reshape(num_layers, -1)
    # hierarchical: improve inside each node, on layers whose groups sit whole on one node
    size = layout.num_experts // layout.num_groups
    node_of_slot = np.arange(layout.num_slots) // (per_node * slots)
    group = current // size
    home = np.full((num_layers, layout.num_groups), -1)
    np.maximum.at(home, (np.arange(num_layers)[:, None], group), node_of_slot[None, :])
    lowest = np.full((num_layers, layout.num_groups), nodes)
    np.minimum.at(lowest, (np.arange(num_layers)[:, None], group), node_of_slot[None, :])
    per_node_groups = np.stack([(home == n).sum(axis=1) for n in range(nodes)], axis=1)
    ok = (home == lowest).all(axis=1) & (per_node_groups == layout.num_groups // nodes).all(axis=1)
    out = current.copy()
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return out
    # node-local expert ids: the node's groups in ascending order
    groups_of_node = np.argsort(home[idx], axis=1, kind="stable").reshape(idx.size, nodes, -1)
    experts = (groups_of_node[..., None] * size + np.arange(size)).reshape(idx.size * nodes, -1)  # [R, E/N]
    to_local = np.zeros((idx.size * nodes, layout.num_experts), dtype=np.int64)
    np.put_along_axis(to_local, experts, np.broadcast_to(np.arange(experts.shape[1]), experts.shape), axis=1)
    state = current[idx].reshape(idx.size * nodes, per_node, slots)
    state_local = np.take_along_axis(to_local, state.reshape(idx.size * nodes, -1), axis=1).reshape(
        state.shape
    )
    row_mean = np.take_along_axis(np.repeat(mean[idx], nodes, axis=0), experts, axis=1)
    rows = experts.shape[0]
    row_scen = np.take_along_axis(
        np.repeat(scen[idx], nodes, axis=0),
        np.broadcast_to(experts[:, None, :], (rows, scen.shape[1], experts.shape[1])),
        axis=2,
    )
    bins = Bins(per_node, slots, np.arange(per_node))
    better = solver(state_local, row_scen, row_mean, bins, budget)
    glob = np.take_along_axis(experts, better.reshape(idx.size * nodes, -1), axis=1)
    out[idx] = glob.reshape(idx.size, -1)
    return out
