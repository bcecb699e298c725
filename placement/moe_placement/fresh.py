"""A fresh placement from a forecast, respecting the node hierarchy.

Hierarchical (expert groups divide over nodes, as in DeepSeek's rule): whole groups go to
nodes, and every copy of an expert stays on its group's node, so group-limited routing
keeps its bound on the nodes a token visits. Otherwise one pool of GPUs; with static
dispatch across several nodes, copies of one expert go to different nodes, because SGLang's
static rule sends a node's ranks to the node's first copy and uneven copies per node would
split the expert's tokens unevenly.
"""

from __future__ import annotations

import numpy as np

from .layout import FloatArray, IntArray, Layout, expert_counts
from .packing import Bins, lpt
from .search import pair_refine
from .solve import item_loads, solve_rows


def place_rows(
    mean: FloatArray, scen: FloatArray, layout: Layout, dispatch: str, rounds: int | None = None
) -> IntArray:
    """phy2log [B, P] for B independent layers: mean [B, E], scenarios [B, K, E].

    ``rounds``: at most this many rounds of exchanges per row (default: search.py's caps)."""
    num_layers, num_slots = mean.shape[0], layout.num_slots
    if layout.hierarchical:
        experts = node_experts(mean, scen, layout)  # [L, N, E/N]
        rows = num_layers * layout.num_nodes
        local = experts.reshape(rows, -1)
        row_mean = np.take_along_axis(np.repeat(mean, layout.num_nodes, axis=0), local, axis=1)
        row_scen = np.take_along_axis(
            np.repeat(scen, layout.num_nodes, axis=0),
            np.broadcast_to(local[:, None, :], (rows, scen.shape[1], local.shape[1])),
            axis=2,
        )
        bins = Bins(layout.gpus_per_node, layout.slots_per_gpu, np.arange(layout.gpus_per_node))
        sol = solve_rows(row_mean, row_scen, bins, cap=layout.gpus_per_node, rounds=rounds)
        phy = np.take_along_axis(local, sol.expert.reshape(rows, -1), axis=1)
        return phy.reshape(num_layers, num_slots)
    bins = flat_bins(layout, dispatch)
    sol = solve_rows(mean, scen, bins, cap=bins.num_domains, rounds=rounds)
    return sol.expert.reshape(num_layers, num_slots)


def flat_bins(layout: Layout, dispatch: str) -> Bins:
    """All GPUs as one pool; with static dispatch over several nodes, an expert's copies on different nodes."""
    per_node = layout.gpus_per_node
    by_node = dispatch == "static" and layout.num_nodes > 1
    domain = np.arange(layout.num_gpus) // per_node if by_node else np.arange(layout.num_gpus)
    return Bins(layout.num_gpus, layout.slots_per_gpu, domain)


def refit_rows(phy2log: IntArray, scen: FloatArray, layout: Layout, dispatch: str) -> IntArray:
    """A plan's rows [B, P] searched on further, on scenarios [B, K, E], their copy counts kept.

    Cheaper than place_rows on the same scenarios (no packing, a search that starts near its
    end) where the plan was fitted on some of them. Not for hierarchical layouts (whole groups
    per node: the search here moves copies across nodes)."""
    if layout.hierarchical:
        raise ValueError("refit_rows: a hierarchical layout is refitted by place_rows")
    rows = phy2log.shape[0]
    if rows == 0:
        return phy2log.copy()
    bins = flat_bins(layout, dispatch)
    loads = item_loads(scen, expert_counts(phy2log, layout.num_experts), phy2log)  # items: the slots
    start = np.broadcast_to(
        np.arange(layout.num_slots).reshape(1, bins.num_gpus, bins.slots), (rows, bins.num_gpus, bins.slots)
    )
    order = pair_refine(loads, phy2log, layout.num_experts, bins, start.copy())
    out: IntArray = np.take_along_axis(phy2log, order.reshape(rows, -1), axis=1)
    return out


def node_experts(mean: np.ndarray, scen: np.ndarray, layout: Layout) -> IntArray:
    """Whole expert groups to nodes, balancing node load on the forecast, then on scenarios. -> [L, N, E/N]."""
    num_layers, num_experts = mean.shape
    groups, nodes = layout.num_groups, layout.num_nodes
    size = num_experts // groups
    group_load = mean.reshape(num_layers, groups, size).sum(axis=2)
    group_scen = scen.reshape(num_layers, scen.shape[1], groups, size).sum(axis=3)
    ids = np.broadcast_to(np.arange(groups), (num_layers, groups)).copy()
    bins = Bins(nodes, groups // nodes, np.arange(nodes))
    placed = lpt(group_load, ids, groups, bins)  # [L, N, groups/node]
    placed = pair_refine(group_scen.transpose(0, 2, 1), ids, groups, bins, placed)
    members: IntArray = (placed[..., None] * size + np.arange(size)).reshape(num_layers, nodes, -1)
    return members
