"""How many copies each expert gets (the redundant slots), per row of a batch.

A row is one independent sub-problem: a layer (global placement) or a layer's node
(hierarchical placement). Candidates are compared later by packing them, because the best
copy counts depend on how the copies pack (the toy case in the facts file is an example:
greedy on tokens per copy cannot reach the optimum there).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .layout import FloatArray, IntArray

MAX_ENUMERATED = 8192  # exhaustive search over copy counts below this many vectors


def greedy_counts(score: FloatArray, total: int, cap: int) -> IntArray:
    """Each extra copy to the expert with the highest score per copy (DeepSeek's rule on ``score``)."""
    rows, num_experts = score.shape
    counts = np.ones((rows, num_experts), dtype=np.int64)
    row_ids = np.arange(rows)
    for _ in range(total - num_experts):
        hot = np.argmax(np.where(counts < cap, score / counts, -np.inf), axis=1)
        counts[row_ids, hot] += 1
    return counts


def scenario_counts(scenarios: FloatArray, total: int, cap: int) -> IntArray:
    """Extra copies that most reduce the sum over scenarios of the largest per-copy load.

    scenarios [B, K, E]. With one slot per GPU this is exactly the expected per-step
    bottleneck (SGLang's deepseek_vec idea); with more slots it is a candidate for packing.
    Only experts in some scenario's top (extra + 2) can ever be a scenario's largest or
    second largest per-copy load (at most ``extra`` experts get split), so the search runs
    on that subset: same result, far less work.
    """
    rows, num_scen, num_experts = scenarios.shape
    extra = total - num_experts
    counts = np.ones((rows, num_experts), dtype=np.int64)
    if extra <= 0:
        return counts
    keep = min(num_experts, extra + 2)
    if keep < num_experts:
        top = np.argpartition(-scenarios, keep - 1, axis=2)[:, :, :keep]
        member = np.zeros((rows, num_experts), dtype=bool)
        member[np.arange(rows)[:, None, None], top] = True
    else:
        member = np.ones((rows, num_experts), dtype=bool)
    width = int(member.sum(axis=1).max())
    cols = np.argsort(~member, axis=1, kind="stable")[:, :width]  # candidate experts first
    valid = np.take_along_axis(member, cols, axis=1)
    sub = np.take_along_axis(scenarios, np.broadcast_to(cols[:, None, :], (rows, num_scen, width)), axis=2)
    sub = np.where(valid[:, None, :], sub, 0.0)
    sub_counts = np.ones((rows, width), dtype=np.int64)
    row_ids = np.arange(rows)
    mean_sub = sub.mean(axis=1)
    per_copy = sub.copy()  # [B, K, W], updated one column per row as counts change
    flat_copy = per_copy.reshape(-1, width)  # a view: (row, scenario) pairs
    pairs = np.arange(flat_copy.shape[0])
    row_of = np.repeat(row_ids, num_scen)
    for _ in range(extra):
        first = np.argmax(flat_copy, axis=1)  # [B*K]
        best = flat_copy[pairs, first]
        if width > 1:
            masked = flat_copy.copy()
            masked[pairs, first] = -np.inf
            second = masked[pairs, np.argmax(masked, axis=1)]
        else:
            second = np.zeros_like(best)
        c_first = sub_counts[row_of, first]
        after = best * (c_first / (c_first + 1))
        gain = np.bincount(
            row_of * width + first, weights=best - np.maximum(second, after), minlength=rows * width
        ).reshape(rows, width)
        # tie-break on the mean load per copy so flat scenarios still pick a sensible expert
        key = np.where(valid & (sub_counts < cap), gain + 1e-9 * mean_sub / sub_counts, -np.inf)
        hot = np.argmax(key, axis=1)
        sub_counts[row_ids, hot] += 1
        per_copy[row_ids, :, hot] = sub[row_ids, :, hot] / sub_counts[row_ids, hot][:, None]
    np.put_along_axis(counts, cols, np.where(valid, sub_counts, 1), axis=1)
    return counts


def all_counts(num_experts: int, total: int, cap: int) -> IntArray | None:
    """Every copy-count vector (each >= 1, <= cap, summing to total), or None if too many."""
    extra = total - num_experts
    if math.comb(extra + num_experts - 1, num_experts - 1) > MAX_ENUMERATED:
        return None
    vectors = []
    for bars in itertools.combinations(range(extra + num_experts - 1), num_experts - 1):
        edges = (-1, *bars, extra + num_experts - 1)
        vec = [edges[i + 1] - edges[i] for i in range(num_experts)]  # each = 1 + extras of expert i
        if max(vec) <= cap:
            vectors.append(vec)
    return np.array(vectors, dtype=np.int64) if vectors else None


def expand(counts: IntArray) -> IntArray:
    """Copy counts [B, E] -> expert of each item [B, P], experts in order."""
    rows, num_experts = counts.shape
    total = int(counts[0].sum())
    experts = np.broadcast_to(np.arange(num_experts), counts.shape).ravel()
    return np.repeat(experts, counts.ravel()).reshape(rows, total)
