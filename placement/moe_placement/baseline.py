"""The DeepSeek EPLB algorithm, re-implemented from its published description.

Used only as the yardstick in benchmarks and tests. Semantics follow the description:
replicate greedily on tokens per copy; pack with longest-processing-time greedy into packs
of a fixed item count; hierarchical (groups to nodes, then replicate and pack inside each
node) when the expert groups divide over the nodes, global otherwise. It never looks at the
current placement. Vectorised over layers (the reference is a Python loop per layer).
"""

from __future__ import annotations

import numpy as np

from .layout import FloatArray, IntArray, as_history, make_layout


def replicate(weight: FloatArray, num_physical: int) -> tuple[IntArray, IntArray]:
    """Each extra slot goes to the expert with the most tokens per copy. -> (phy2log, counts)."""
    rows, num_logical = weight.shape
    phy2log = np.empty((rows, num_physical), dtype=np.int64)
    phy2log[:, :num_logical] = np.arange(num_logical)
    counts = np.ones((rows, num_logical), dtype=np.int64)
    row_ids = np.arange(rows)
    for slot in range(num_logical, num_physical):
        hot = np.argmax(weight / counts, axis=1)
        phy2log[:, slot] = hot
        counts[row_ids, hot] += 1
    return phy2log, counts


def balanced_packing(weight: FloatArray, num_packs: int) -> tuple[IntArray, IntArray]:
    """Heaviest item first into the lightest pack that still has room. -> (pack, rank in pack)."""
    rows, num_items = weight.shape
    per_pack = num_items // num_packs
    if per_pack == 1:
        ident = np.broadcast_to(np.arange(num_items), (rows, num_items)).copy()
        return ident, np.zeros_like(ident)
    order = np.argsort(-weight, axis=1, kind="stable")
    pack_weight = np.zeros((rows, num_packs))
    pack_items = np.zeros((rows, num_packs), dtype=np.int64)
    pack_of = np.empty((rows, num_items), dtype=np.int64)
    rank_of = np.empty((rows, num_items), dtype=np.int64)
    row_ids = np.arange(rows)
    for step in range(num_items):
        item = order[:, step]
        pack = np.argmin(np.where(pack_items < per_pack, pack_weight, np.inf), axis=1)
        pack_of[row_ids, item] = pack
        rank_of[row_ids, item] = pack_items[row_ids, pack]
        pack_weight[row_ids, pack] += weight[row_ids, item]
        pack_items[row_ids, pack] += 1
    return pack_of, rank_of


def _inverse(perm: IntArray) -> IntArray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def _hierarchical(
    weight: FloatArray, num_physical: int, num_groups: int, num_nodes: int, num_gpus: int
) -> IntArray:
    num_layers, num_logical = weight.shape
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    per_gpu = num_physical // num_gpus
    # 1. whole groups to nodes; renumber experts node-major ("mlog")
    group_pack, group_rank = balanced_packing(
        weight.reshape(num_layers, num_groups, group_size).sum(-1), num_nodes
    )
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size)[:, :, None] + np.arange(group_size)
    ).reshape(num_layers, num_logical)
    mlog2log = _inverse(log2mlog)
    # 2. replicate inside each node
    node_weight = np.take_along_axis(weight, mlog2log, axis=1).reshape(num_layers * num_nodes, -1)
    phy2mlog, counts = replicate(node_weight, num_physical // num_nodes)
    # 3. pack the node's copies onto its GPUs
    copy_weight = np.take_along_axis(node_weight / counts, phy2mlog, axis=1)
    pack, rank = balanced_packing(copy_weight, num_gpus // num_nodes)
    pphy2phy = _inverse(pack * per_gpu + rank)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1).reshape(num_layers, num_nodes, -1)
    pphy2mlog = (pphy2mlog + (np.arange(num_nodes) * (num_logical // num_nodes))[None, :, None]).reshape(
        num_layers, -1
    )
    return np.take_along_axis(mlog2log, pphy2mlog, axis=1)


def baseline_plan(
    loads_LE: object, *, num_gpus: int, num_nodes: int = 1, num_redundant: int = 0, num_groups: int = 1
) -> IntArray:
    """DeepSeek EPLB on one window of loads [L, E] (a [T, L, E] history is summed, as SGLang does)."""
    weight = as_history(loads_LE).sum(axis=0)
    layout = make_layout(
        weight.shape[0],
        weight.shape[1],
        num_gpus=num_gpus,
        num_nodes=num_nodes,
        num_redundant=num_redundant,
        num_groups=num_groups,
    )
    if layout.num_groups % layout.num_nodes == 0:
        return _hierarchical(weight, layout.num_slots, layout.num_groups, layout.num_nodes, layout.num_gpus)
    return _hierarchical(weight, layout.num_slots, 1, 1, layout.num_gpus)
