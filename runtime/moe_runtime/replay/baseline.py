"""Stand-in for SGLang's own EPLB algorithm in the replay engine (no torch there).

The same greedy as DeepSeek's global policy: every redundant slot goes to the expert
with the highest load per copy, then copies are packed heaviest first onto the lightest
GPU that still has a free slot.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

from moe_placement.maps import IntArray


def deepseek_global(loads: npt.ArrayLike, num_gpus: int, num_redundant: int) -> IntArray:
    """phy2log [L, E + R] for loads [L, E] (or [T, L, E], summed)."""
    arr = np.asarray(loads, dtype=np.float64)
    if arr.ndim == 3:
        arr = arr.sum(axis=0)
    layers, experts = arr.shape
    slots = experts + num_redundant
    if slots % num_gpus:
        raise ValueError(f"{slots} slots do not divide over {num_gpus} GPUs")
    per_gpu = slots // num_gpus
    out = np.empty((layers, slots), dtype=np.int64)
    for layer in range(layers):
        w = arr[layer]
        copies = np.ones(experts, dtype=np.int64)
        heap = [(-w[e], e) for e in range(experts)]
        heapq.heapify(heap)
        for _ in range(num_redundant):
            _, e = heapq.heappop(heap)
            copies[e] += 1
            heapq.heappush(heap, (-w[e] / copies[e], e))
        items = np.repeat(np.arange(experts), copies)
        item_load = (w / copies)[items]
        order = np.argsort(-item_load, kind="stable")
        gpu_load = np.zeros(num_gpus)
        gpu_fill = np.zeros(num_gpus, dtype=np.int64)
        for i in order:
            free = np.flatnonzero(gpu_fill < per_gpu)
            g = free[np.argmin(gpu_load[free])]
            out[layer, g * per_gpu + gpu_fill[g]] = items[i]
            gpu_fill[g] += 1
            gpu_load[g] += item_load[i]
    return out
