"""Copies and packing for a batch of independent rows, choosing the best of several tries.

Copy counts and packing interact (a hot expert split into fewer, larger copies can pair
with light experts), so several count vectors are packed and compared. The comparison is
on scenarios (forecast errors and per-step spread), i.e. the expected per-step bottleneck,
which is what the engine pays; packing itself works on the forecast mean. Small rows try
every count vector (exact up to the packing heuristic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import FloatArray, IntArray
from .packing import Bins, gpu_totals, lpt, refine, refine_scenarios
from .replicate import all_counts, expand, greedy_counts, scenario_counts

MAX_EXHAUSTIVE_ROWS = 16384  # rows x count vectors packed at once in exhaustive mode
REFINED_PER_ROW = 3  # in exhaustive mode, the best LPT candidates of a row that get refined


@dataclass(frozen=True)
class Solution:
    """expert [B, G, S]: logical expert (row-local index) in each slot; cost [B] expected peak."""

    expert: IntArray
    cost: FloatArray


def solve_rows(mean: FloatArray, scenarios: FloatArray, bins: Bins, cap: int) -> Solution:
    """mean [B, E] forecast and scenarios [B, K, E]; fills bins.num_gpus * bins.slots slots per row."""
    rows, num_experts = mean.shape
    total = bins.num_gpus * bins.slots
    # copies per expert: at most one per conflict domain, unless the slots need more
    cap = max(-(-total // num_experts), min(cap, total - num_experts + 1))
    candidates = [greedy_counts(mean, total, cap)]
    if scenarios.shape[1] > 1 and total > num_experts:
        alt = scenario_counts(scenarios, total, cap)
        if not np.array_equal(alt, candidates[0]):
            candidates.append(alt)
    exhaustive = False
    if total > num_experts:
        every = all_counts(num_experts, total, cap)
        if every is not None and rows * len(every) <= MAX_EXHAUSTIVE_ROWS:
            candidates = [np.broadcast_to(every[None], (rows, *every.shape)).reshape(-1, num_experts)]
            exhaustive = True
    counts = np.stack([c.reshape(rows, -1, num_experts) for c in candidates], axis=1).reshape(
        rows, -1, num_experts
    )
    num_cand = counts.shape[1]
    flat_counts = counts.reshape(-1, num_experts)
    expert = expand(flat_counts)  # [R, I]
    flat_mean = np.repeat(mean, num_cand, axis=0)
    weight = np.take_along_axis(flat_mean / flat_counts, expert, axis=1)
    layout = lpt(weight, expert, num_experts, bins)
    if exhaustive and num_cand > REFINED_PER_ROW:
        peak = gpu_totals(weight, layout).max(axis=1).reshape(rows, num_cand)
        keep = np.argsort(peak, axis=1, kind="stable")[:, :REFINED_PER_ROW]
        pick = (np.arange(rows)[:, None] * num_cand + keep).ravel()
        expert, weight, layout, flat_counts = expert[pick], weight[pick], layout[pick], flat_counts[pick]
        num_cand = keep.shape[1]
    layout = refine(weight, expert, num_experts, bins, layout)
    slot_expert = np.take_along_axis(expert, layout.reshape(layout.shape[0], -1), axis=1)
    cost = expected_peak(np.repeat(scenarios, num_cand, axis=0), flat_counts, slot_expert, bins.num_gpus)
    cost = cost.reshape(rows, num_cand)
    best = np.argmin(cost, axis=1)
    chosen = np.arange(rows) * num_cand + best
    slot_expert, counts = slot_expert[chosen], flat_counts[chosen]
    if scenarios.shape[1] > 1 and bins.slots > 1:
        per_copy = scenarios / counts[:, None, :]
        load = np.take_along_axis(
            per_copy,
            np.broadcast_to(slot_expert[:, None, :], (rows, scenarios.shape[1], slot_expert.shape[1])),
            axis=2,
        )
        start = np.broadcast_to(
            np.arange(slot_expert.shape[1]).reshape(1, bins.num_gpus, bins.slots),
            (rows, bins.num_gpus, bins.slots),
        )
        order = refine_scenarios(load, slot_expert, num_experts, bins, start.copy())
        slot_expert = np.take_along_axis(slot_expert, order.reshape(rows, -1), axis=1)
    final = expected_peak(scenarios, counts, slot_expert, bins.num_gpus)
    return Solution(slot_expert.reshape(rows, bins.num_gpus, bins.slots), final)


def expected_peak(
    scenarios: FloatArray, counts: IntArray, slot_expert: IntArray, num_gpus: int
) -> FloatArray:
    """Mean over scenarios of the busiest GPU's load (copies split evenly), per row."""
    rows, num_scen, _ = scenarios.shape
    per_copy = scenarios / counts[:, None, :]
    idx = np.broadcast_to(slot_expert[:, None, :], (rows, num_scen, slot_expert.shape[1]))
    loads = np.take_along_axis(per_copy, idx, axis=2).reshape(rows, num_scen, num_gpus, -1).sum(axis=3)
    out: FloatArray = loads.max(axis=2).mean(axis=1)
    return out
