"""Expert placement maps in numpy: validate, derive SGLang's companion tensors, score.

Everything here is pure and torch-free so that the plugin's core logic, the sidecar and
the replay engine share one implementation (the plugin only converts tensors at the edge).

Shapes follow SGLang's ``rebalance_experts`` contract:
``physical_to_logical_map`` int64 [L, P]; ``logical_to_all_physical_map`` int64 [L, E, X]
padded with -1; ``expert_count`` int64 [L, E]. Physical slot ``p`` lives on GPU
``p // (P // G)``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Dispatch = Literal["static", "dynamic"]

_EPS = 1e-5  # SGLang's compute_utilization_rate adds it to mean and max


class PlacementError(ValueError):
    """A map the engine must not apply (wrong shape, dropped expert, bad ids)."""


def validate_map(
    phy2log: npt.ArrayLike,
    *,
    num_layers: int | None,
    num_logical: int,
    num_physical: int | None,
    num_gpus: int | None = None,
) -> IntArray:
    """Return the map as int64 [L, P] or raise PlacementError saying what is wrong."""
    try:
        arr = np.asarray(phy2log)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise PlacementError(f"physical_to_logical_map is not a rectangular array: {exc}") from exc
    if arr.ndim != 2:
        raise PlacementError(f"physical_to_logical_map must be 2-D [layers, slots], got shape {arr.shape}")
    if arr.size == 0:
        raise PlacementError("physical_to_logical_map is empty")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise PlacementError(f"physical_to_logical_map must hold integers, got {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    layers, slots = arr.shape
    if num_layers is not None and layers != num_layers:
        raise PlacementError(f"map has {layers} layers, engine has {num_layers}")
    if num_physical is not None and slots != num_physical:
        raise PlacementError(f"map has {slots} physical slots per layer, engine has {num_physical}")
    if num_gpus is not None and slots % num_gpus != 0:
        raise PlacementError(f"{slots} slots do not divide evenly over {num_gpus} GPUs")
    if slots < num_logical:
        raise PlacementError(f"{slots} slots cannot hold {num_logical} experts")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= num_logical:
        raise PlacementError(f"expert ids must be in [0, {num_logical}), got range [{lo}, {hi}]")
    counts = expert_count(arr, num_logical)
    missing = np.argwhere(counts == 0)
    if missing.size:
        layer, expert = (int(v) for v in missing[0])
        raise PlacementError(
            f"map drops {len(missing)} expert(s), e.g. expert {expert} of layer {layer} has no slot"
        )
    return arr


def map_problems(
    phy2log: npt.ArrayLike,
    *,
    num_layers: int,
    num_logical: int,
    num_physical: int,
    num_gpus: int | None = None,
) -> list[str]:
    """``validate_map``'s verdict for callers that report instead of raising: empty means safe."""
    try:
        validate_map(
            phy2log,
            num_layers=num_layers,
            num_logical=num_logical,
            num_physical=num_physical,
            num_gpus=num_gpus,
        )
    except PlacementError as exc:
        return [str(exc)]
    return []


def expert_count(phy2log: IntArray, num_logical: int) -> IntArray:
    """Copies of each logical expert per layer, int64 [L, E]."""
    layers = phy2log.shape[0]
    offsets = (np.arange(layers, dtype=np.int64) * num_logical)[:, None]
    flat = np.bincount((phy2log + offsets).ravel(), minlength=layers * num_logical)
    return flat.reshape(layers, num_logical).astype(np.int64)


def logical_to_all_physical(phy2log: IntArray, num_logical: int) -> IntArray:
    """[L, E, X] physical slots of every expert in ascending order, padded with -1.

    Ascending order is what SGLang's own ``init_by_mapping`` produces; X is the largest
    copy count, as in ``deepseek.rebalance_experts``.
    """
    layers, slots = phy2log.shape
    counts = expert_count(phy2log, num_logical)
    width = int(counts.max())
    # Stable sort of slots by expert id keeps slots of one expert ascending (radix sort on int16).
    keys = phy2log.astype(np.int16) if num_logical <= np.iinfo(np.int16).max else phy2log
    order = np.argsort(keys, axis=1, kind="stable")
    sorted_experts = np.take_along_axis(phy2log, order, axis=1)
    starts = np.cumsum(counts, axis=1) - counts  # first sorted index of each expert
    rank = np.arange(slots, dtype=np.int64)[None, :] - np.take_along_axis(starts, sorted_experts, axis=1)
    out = np.full((layers, num_logical, width), -1, dtype=np.int64)
    layer_idx = np.repeat(np.arange(layers), slots)
    out[layer_idx, sorted_experts.ravel(), rank.ravel()] = order.ravel()
    return out


def rebalance_outputs(phy2log: IntArray, num_logical: int) -> tuple[IntArray, IntArray, IntArray]:
    """The three arrays ``rebalance_experts`` returns, derived from one map."""
    return phy2log, logical_to_all_physical(phy2log, num_logical), expert_count(phy2log, num_logical)


def trivial_map(num_layers: int, num_logical: int, num_physical: int) -> IntArray:
    """SGLang's trivial placement: slot p holds expert p % E (redundant slots wrap)."""
    row = np.arange(num_physical, dtype=np.int64) % num_logical
    return np.tile(row, (num_layers, 1))


def slot_shares(
    phy2log: IntArray,
    num_logical: int,
    num_gpus: int,
    *,
    dispatch: Dispatch = "static",
    gpus_per_node: int | None = None,
) -> FloatArray:
    """Fraction of each expert's tokens that each physical slot receives, float [L, P].

    ``dynamic``: tokens split evenly over copies. ``static``: every source rank sends
    all its tokens of an expert to one copy, chosen as SGLang's
    ``compute_logical_to_rank_dispatch_physical_map`` does (same GPU, then same node,
    else a fair spread), with tokens assumed to come evenly from all ranks.
    """
    counts = expert_count(phy2log, num_logical)
    copies = np.take_along_axis(counts, phy2log, axis=1).astype(np.float64)
    shares = 1.0 / copies
    if dispatch == "dynamic":
        return shares
    _layers, slots = phy2log.shape
    per_gpu = slots // num_gpus
    gpu_of_slot = np.arange(slots) // per_gpu
    for layer, expert in np.argwhere(counts > 1):
        cand = np.flatnonzero(phy2log[layer] == expert)
        assigned = np.zeros(len(cand), dtype=np.float64)
        spread = 0
        cand_gpus = gpu_of_slot[cand]
        for rank in range(num_gpus):
            same_gpu = np.flatnonzero(cand_gpus == rank)
            if same_gpu.size:
                assigned[same_gpu[0]] += 1
                continue
            if gpus_per_node:
                same_node = np.flatnonzero(cand_gpus // gpus_per_node == rank // gpus_per_node)
                if 0 < same_node.size < cand.size:
                    assigned[same_node[0]] += 1
                    continue
            spread += 1
        assigned += spread / cand.size
        shares[layer, cand] = assigned / num_gpus
    return shares


def gpu_loads(loads_le: npt.ArrayLike, phy2log: IntArray, shares: FloatArray, num_gpus: int) -> FloatArray:
    """Tokens per GPU per layer, float [L, G], for per-expert loads [L, E] (or [T, L, E])."""
    loads = np.asarray(loads_le, dtype=np.float64)
    _layers, slots = phy2log.shape
    idx = np.broadcast_to(phy2log, (*loads.shape[:-1], slots))
    per_slot = np.take_along_axis(loads, idx, axis=-1) * shares
    out: FloatArray = per_slot.reshape(*per_slot.shape[:-1], num_gpus, slots // num_gpus).sum(axis=-1)
    return out


def balancedness(gpu: FloatArray) -> FloatArray:
    """SGLang's per-layer utilization rate: (mean_gpu + eps) / (max_gpu + eps); 1.0 = perfect."""
    out: FloatArray = (gpu.mean(axis=-1) + _EPS) / (gpu.max(axis=-1) + _EPS)
    return out


def max_over_mean(gpu: FloatArray) -> FloatArray:
    """Per-layer max/mean of GPU loads (the inverse view; 1.0 = perfect, empty layers 1.0)."""
    mean = gpu.mean(axis=-1)
    out: FloatArray = np.ones_like(mean)
    np.divide(gpu.max(axis=-1), mean, out=out, where=mean > 0)
    return out
