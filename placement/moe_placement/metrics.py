"""How a placement splits tokens over GPUs, and how balanced that is.

Dispatch rules (tokens are assumed to originate evenly on every source rank, as with
DP attention):

* ``dynamic``: each token picks one of its expert's copies uniformly, so an expert's
  tokens are split evenly over its copies.
* ``static``: SGLang 0.5.23 (``compute_logical_to_rank_dispatch_physical_map``) fixes one
  copy per source rank: an expert with one copy uses it; otherwise a rank holding a copy
  uses the first one on its own GPU; otherwise, when its node holds some but not all of the
  copies, the first copy on its node; otherwise a seeded fair draw over all copies. We model
  the fair draw by its expectation (an even split of those ranks over all copies).
"""

from __future__ import annotations

import numpy as np

from .layout import DISPATCH_RULES, FloatArray, IntArray, expert_counts

EPS = 1e-5  # SGLang's compute_utilization_rate adds this to mean and max


def slot_shares(
    phy2log: IntArray, num_experts: int, num_gpus: int, dispatch: str, num_nodes: int = 1
) -> FloatArray:
    """Fraction of its expert's tokens that each slot receives, [L, P]."""
    if dispatch not in DISPATCH_RULES:
        raise ValueError(f"dispatch must be one of {DISPATCH_RULES}, got {dispatch!r}")
    num_layers, num_slots = phy2log.shape
    counts = expert_counts(phy2log, num_experts)
    copies = np.take_along_axis(counts, phy2log, axis=1).astype(np.float64)
    if dispatch == "dynamic":
        return 1.0 / copies
    slots_per_gpu = num_slots // num_gpus
    per_node = num_gpus // num_nodes
    gpu = np.arange(num_slots) // slots_per_gpu
    node = gpu // per_node
    first_on_gpu = _first_occurrence(phy2log * num_gpus + gpu[None, :])
    node_key = phy2log * num_nodes + node[None, :]
    first_on_node = _first_occurrence(node_key)
    size = num_experts * num_nodes
    offsets = (np.arange(num_layers) * size)[:, None]
    copies_on_node = np.bincount((node_key + offsets).ravel(), minlength=num_layers * size)
    gpus_on_node = np.bincount(
        (node_key + offsets).ravel(), weights=first_on_gpu.ravel(), minlength=num_layers * size
    )
    copies_on_node = copies_on_node.reshape(num_layers, num_experts, num_nodes).astype(np.float64)
    gpus_on_node = gpus_on_node.reshape(num_layers, num_experts, num_nodes)
    total = counts[:, :, None].astype(np.float64)
    # ranks that fall through to the fair draw: nodes without a copy, and nodes with all of them
    fair = np.where(copies_on_node == 0, per_node, 0.0) + np.where(
        copies_on_node == total, per_node - gpus_on_node, 0.0
    )
    fair_ranks = fair.sum(axis=2)  # [L, E]
    k_slot = copies_on_node.reshape(num_layers, size)[np.arange(num_layers)[:, None], node_key]
    h_slot = gpus_on_node.reshape(num_layers, size)[np.arange(num_layers)[:, None], node_key]
    node_first = first_on_node & (k_slot > 0) & (k_slot < copies)
    ranks = (
        first_on_gpu.astype(np.float64)
        + np.where(node_first, per_node - h_slot, 0.0)
        + np.take_along_axis(fair_ranks, phy2log, axis=1) / copies
    )
    return ranks / num_gpus


def _first_occurrence(keys: IntArray) -> np.ndarray:
    """Per row, True where a key appears for the first time in slot order."""
    order = np.argsort(keys, axis=1, kind="stable")
    sorted_keys = np.take_along_axis(keys, order, axis=1)
    first_sorted = np.ones_like(sorted_keys, dtype=bool)
    first_sorted[:, 1:] = sorted_keys[:, 1:] != sorted_keys[:, :-1]
    out = np.empty_like(first_sorted)
    np.put_along_axis(out, order, first_sorted, axis=1)
    return out


def gpu_loads(
    phy2log: IntArray, loads: FloatArray, num_gpus: int, dispatch: str = "dynamic", num_nodes: int = 1
) -> FloatArray:
    """Tokens per GPU, [..., L, G], for loads [..., L, E] under a placement [L, P]."""
    num_layers, num_slots = phy2log.shape
    num_experts = loads.shape[-1]
    shares = slot_shares(phy2log, num_experts, num_gpus, dispatch, num_nodes)
    # one flat gather (np.take) is about twice as fast as 2-D fancy indexing on [K, L, E] scenarios
    cell = np.arange(num_layers)[:, None] * num_experts + phy2log
    lead = loads.shape[:-2]
    slot_loads: FloatArray = np.take(loads.reshape(*lead, num_layers * num_experts), cell, axis=-1).astype(
        np.float64, copy=False
    )
    slot_loads *= shares  # in place: a second [K, L, P] array costs as much as the gather
    if num_slots == num_gpus:
        return slot_loads
    out: FloatArray = slot_loads.reshape(*slot_loads.shape[:-1], num_gpus, num_slots // num_gpus).sum(axis=-1)
    return out


def imbalance(gpu_load: FloatArray) -> FloatArray:
    """max/mean over GPUs (last axis); 1.0 when a layer saw no tokens."""
    mean = gpu_load.mean(axis=-1)
    peak = gpu_load.max(axis=-1)
    return np.where(mean > 0, peak / np.where(mean > 0, mean, 1.0), 1.0)


def balancedness(
    physical_to_logical_map: object,
    loads_LE: object,
    num_gpus: int,
    dispatch: str = "dynamic",
    *,
    num_nodes: int = 1,
) -> FloatArray:
    """SGLang's per-layer balancedness (mean_gpu + 1e-5) / (max_gpu + 1e-5), [L].

    ``num_nodes`` only matters for ``static`` dispatch (it decides which copies share a node).
    """
    phy2log = np.asarray(physical_to_logical_map, dtype=np.int64)
    loads = np.asarray(loads_LE, dtype=np.float64)
    if phy2log.ndim != 2 or loads.ndim != 2 or phy2log.shape[0] != loads.shape[0]:
        raise ValueError(
            f"need physical_to_logical_map [L, P] and loads [L, E] with the same L, "
            f"got {list(phy2log.shape)} and {list(loads.shape)}"
        )
    if num_gpus < 1 or phy2log.shape[1] % num_gpus or num_gpus % num_nodes:
        raise ValueError(f"{phy2log.shape[1]} slots do not divide over {num_gpus} GPUs in {num_nodes} nodes")
    if phy2log.min() < 0 or phy2log.max() >= loads.shape[1]:
        raise ValueError("physical_to_logical_map refers to experts outside the loads")
    load = gpu_loads(phy2log, loads, num_gpus, dispatch, num_nodes)
    result: FloatArray = (load.mean(axis=-1) + EPS) / (load.max(axis=-1) + EPS)
    return result


def moved_slots(old: IntArray, new: IntArray) -> int:
    """Slots whose logical expert changes (each needs an expert's weights copied in)."""
    return int(np.count_nonzero(np.asarray(old) != np.asarray(new)))


def gpu_moves(old: IntArray, new: IntArray, num_gpus: int) -> int:
    """Expert copies GPUs must load to go from ``old`` to ``new`` [L, P]: per GPU, the copies of
    experts it did not hold before (reordering slots inside a GPU loads nothing)."""
    return int(gpu_moves_per_layer(old, new, num_gpus).sum())


def gpu_moves_per_layer(old: IntArray, new: IntArray, num_gpus: int) -> IntArray:
    """Per layer [L], the expert copies GPUs must load to go from ``old`` to ``new`` (multiset difference per GPU)."""
    old_arr, new_arr = np.asarray(old, dtype=np.int64), np.asarray(new, dtype=np.int64)
    num_layers, num_slots = new_arr.shape
    slots = num_slots // num_gpus
    o = old_arr.reshape(num_layers, num_gpus, slots)
    n = new_arr.reshape(num_layers, num_gpus, slots)
    in_new = (n[..., :, None] == n[..., None, :]).sum(axis=-1)  # [L, G, S]: copies of slot j's expert in new
    in_old = (n[..., :, None] == o[..., None, :]).sum(axis=-1)
    per_slot = np.maximum(in_new - in_old, 0) / in_new
    out: IntArray = np.rint(per_slot.reshape(num_layers, -1).sum(axis=1)).astype(np.int64)
    return out
