"""Copies and packing for a batch of independent rows (a layer, or a layer's node).

1. Copy counts: DeepSeek's greedy rule on the forecast mean, and the same greedy rule on
   scenarios (each extra copy where it lowers the mean over scenarios of the largest
   per-copy load; SGLang's deepseek_vec idea). With one slot per GPU the counts decide
   everything, and the scenario rule is exactly the objective.
2. Each candidate is packed by longest-processing-time greedy on the mean (DeepSeek's
   packing, plus: two copies of one expert never share a conflict domain).
3. The candidate with the lower objective (mean over scenarios of the busiest GPU) is
   improved by pairwise exchanges on scenarios (search.py), which never raise it.
Small rows (few count vectors) try every count vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import FloatArray, IntArray
from .packing import Bins, lpt
from .replicate import all_counts, expand, greedy_counts, scenario_counts
from .search import expected_peak, gpu_scenario_loads, pair_refine

MAX_EXHAUSTIVE_ROWS = 16384  # rows x count vectors packed at once in exhaustive mode
REFINED = 3  # best packed candidates per row that get the exchange search


@dataclass(frozen=True)
class Solution:
    """expert [B, G, S]: logical expert (row-local index) in each slot; cost [B] expected peak."""

    expert: IntArray
    cost: FloatArray


def item_loads(scenarios: FloatArray, counts: IntArray, expert: IntArray) -> FloatArray:
    """Per-scenario load of every copy [B, I, K] (scenarios last): its expert's load split over its copies."""
    per_copy = (scenarios / counts[:, None, :]).transpose(0, 2, 1)  # [B, E, K]
    out: FloatArray = per_copy[np.arange(expert.shape[0])[:, None], expert]
    return out


def solve_rows(
    mean: FloatArray, scenarios: FloatArray, bins: Bins, cap: int, rounds: int | None = None
) -> Solution:
    """mean [B, E] forecast and scenarios [B, K, E]; fills bins.num_gpus * bins.slots slots per row.

    ``rounds``: at most this many rounds of exchanges (default: search.py's caps)."""
    rows, num_experts = mean.shape
    total = bins.num_gpus * bins.slots
    # copies per expert: at most one per conflict domain, unless the slots need more
    cap = max(-(-total // num_experts), min(cap, total - num_experts + 1))
    hedging = scenarios.shape[1] > 1 and total > num_experts
    # one slot per GPU: the scenario rule is the objective itself, greedy on the mean cannot beat it
    candidates = [] if hedging and bins.slots == 1 else [greedy_counts(mean, total, cap)]
    if hedging:
        alt = scenario_counts(scenarios, total, cap)
        if not candidates or not np.array_equal(alt, candidates[0]):
            candidates.append(alt)
    if total > num_experts:
        every = all_counts(num_experts, total, cap)
        if every is not None and rows * len(every) <= MAX_EXHAUSTIVE_ROWS:
            candidates = [np.broadcast_to(every[None], (rows, *every.shape)).reshape(-1, num_experts)]
    counts = np.stack([c.reshape(rows, -1, num_experts) for c in candidates], axis=1).reshape(
        rows, -1, num_experts
    )
    num_cand = counts.shape[1]
    flat_counts = counts.reshape(-1, num_experts)
    expert = expand(flat_counts)  # [R, I] (rows x candidates)
    weight = np.take_along_axis(np.repeat(mean, num_cand, axis=0) / flat_counts, expert, axis=1)
    layout = lpt(weight, expert, num_experts, bins)
    scen = np.repeat(scenarios, num_cand, axis=0)
    cost = expected_peak(gpu_scenario_loads(item_loads(scen, flat_counts, expert), layout)).reshape(
        rows, num_cand
    )
    keep = np.argsort(cost, axis=1, kind="stable")[:, : min(REFINED, num_cand)]  # [B, C']
    pick = (np.arange(rows)[:, None] * num_cand + keep).ravel()
    expert, layout, flat_counts = expert[pick], layout[pick], flat_counts[pick]
    scen = np.repeat(scenarios, keep.shape[1], axis=0)
    loads = item_loads(scen, flat_counts, expert)
    if bins.slots > 1:
        layout = refine_distinct(loads, expert, flat_counts, num_experts, bins, layout, keep.shape[1], rounds)
    cost = expected_peak(gpu_scenario_loads(loads, layout)).reshape(rows, keep.shape[1])
    best = np.arange(rows) * keep.shape[1] + np.argmin(cost, axis=1)
    expert, layout, loads = expert[best], layout[best], loads[best]
    final = expected_peak(gpu_scenario_loads(loads, layout))
    slot_expert = np.take_along_axis(expert, layout.reshape(rows, -1), axis=1)
    return Solution(slot_expert.reshape(rows, bins.num_gpus, bins.slots), final)


def refine_distinct(
    loads: FloatArray,
    expert: IntArray,
    counts: IntArray,
    num_experts: int,
    bins: Bins,
    layout: IntArray,
    width: int,
    rounds: int | None = None,
) -> IntArray:
    """pair_refine on each row's distinct candidates only (``width`` per row, rows x candidates flat).

    Two candidates with the same copy counts are packed alike and searched alike, so one search
    serves both: at DeepSeek-V3 shape the two count rules agree on most rows (4 in 5 node rows at
    EP32, 2 in 5 layers at EP72).
    """
    rows = counts.shape[0] // width
    per_row = counts.reshape(rows, width, -1)
    first = np.broadcast_to(np.arange(width), (rows, width)).copy()  # the first candidate with these counts
    for j in range(width - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            same = (per_row[:, i] == per_row[:, j]).all(axis=1)
            first[same, j] = i
    source = (np.arange(rows)[:, None] * width + first).ravel()
    distinct = np.flatnonzero(source == np.arange(source.size))
    out = layout.copy()
    out[distinct] = pair_refine(
        loads[distinct], expert[distinct], num_experts, bins, layout[distinct], rounds=rounds
    )
    result: IntArray = out[source]
    return result
