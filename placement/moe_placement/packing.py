"""Put copies (items) onto GPUs with a fixed number of slots each, batched over rows.

Construction is DeepSeek's longest-processing-time greedy with one change: two copies of
one expert never share a conflict domain (a GPU, or a node where static dispatch needs it),
because a second copy there adds no capacity. search.py then improves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import compiled
from .layout import FloatArray, IntArray


@dataclass(frozen=True)
class Bins:
    """GPUs of a row: ``slots`` each; ``domain`` [G] is the conflict domain of each GPU."""

    num_gpus: int
    slots: int
    domain: IntArray

    def __post_init__(self) -> None:
        if np.shape(self.domain) != (self.num_gpus,):
            raise ValueError(f"Bins: domain has shape {np.shape(self.domain)}, expected ({self.num_gpus},)")

    @property
    def num_domains(self) -> int:
        return int(self.domain.max()) + 1


def lpt(weight: FloatArray, expert: IntArray, num_experts: int, bins: Bins) -> IntArray:
    """Heaviest copy first onto the lightest GPU with room and no copy of it in its domain.

    weight, expert [B, I] -> layout [B, G, S] of item indices.
    """
    rows, num_items = weight.shape
    if bins.slots == 1:
        return _one_slot_layout(weight, expert, bins)
    order = np.argsort(-weight, axis=1, kind="stable")
    sorted_w = np.take_along_axis(weight, order, axis=1)
    sorted_e = np.take_along_axis(expert, order, axis=1)
    # a GPU holding the expert already is kept for last by adding 1e300: loads must stay well below
    if not (np.isfinite(weight).all() and np.abs(weight).sum(axis=1, initial=0.0).max(initial=0.0) < 1e290):
        raise ValueError("lpt: weights must be finite, each row's total below 1e290")
    if num_items > bins.num_gpus * bins.slots:
        raise ValueError(f"lpt: {num_items} copies for {bins.num_gpus * bins.slots} slots")
    if compiled.ENABLED:
        compiled.require_indices("lpt experts", expert, num_experts)
        compiled.require_indices("lpt domains", bins.domain, bins.num_domains)
        layout = np.full((rows, bins.num_gpus, bins.slots), -1, dtype=np.int64)
        compiled.lpt_fill(
            order.astype(np.int64), np.array(sorted_w, dtype=np.float64),
            sorted_e.astype(np.int64), np.array(bins.domain, dtype=np.int64),
            bins.num_domains, num_experts, bins.slots, layout,
        )  # fmt: skip
        return separate_copies(layout, weight, expert, bins)
    gpu_load = np.zeros((rows, bins.num_gpus))
    fill = np.zeros((rows, bins.num_gpus), dtype=np.int64)
    layout = np.full((rows, bins.num_gpus, bins.slots), -1, dtype=np.int64)
    present = np.zeros((rows, bins.num_domains * num_experts), dtype=bool)
    dom_base = (bins.domain * num_experts)[None, :]
    row_ids = np.arange(rows)
    full = np.inf
    for step in range(num_items):
        e = sorted_e[:, step]
        clash = np.take_along_axis(present, dom_base + e[:, None], axis=1)
        key = np.where(clash, gpu_load + 1e300, gpu_load)  # clash only if nothing else has room
        key[fill >= bins.slots] = full
        gpu = np.argmin(key, axis=1)
        layout[row_ids, gpu, fill[row_ids, gpu]] = order[:, step]
        fill[row_ids, gpu] += 1
        gpu_load[row_ids, gpu] += sorted_w[:, step]
        present[row_ids, bins.domain[gpu] * num_experts + e] = True
    return separate_copies(layout, weight, expert, bins)


def separate_copies(layout: IntArray, weight: FloatArray, expert: IntArray, bins: Bins) -> IntArray:
    """Greedy can be left with a copy in a domain that already holds its expert (the last free
    slots were all there); swap each such copy with the closest-weight copy elsewhere that
    makes both domains clean. Rare, so a plain loop over the clashes."""
    rows, num_gpus, slots = layout.shape
    dom = np.repeat(bins.domain, slots)
    width = int(expert.max(initial=0)) + 1
    keys = np.sort(
        dom[None, :] * width + np.take_along_axis(expert, layout.reshape(rows, -1), axis=1), axis=1
    )
    for r in np.flatnonzero((keys[:, 1:] == keys[:, :-1]).any(axis=1)):
        flat = layout[r].reshape(-1)
        for _ in range(flat.size):
            e = expert[r, flat]
            key = dom * (int(expert[r].max()) + 1) + e
            _, first, seen = np.unique(key, return_index=True, return_counts=True)
            dup = np.flatnonzero(seen > 1)
            if dup.size == 0:
                break
            pos = int(np.flatnonzero(key == key[first[dup[0]]])[1])  # the second copy in that domain
            held = np.zeros((int(dom.max()) + 1, width), dtype=bool)  # which experts each domain holds
            held[dom, e] = True
            # a partner q elsewhere whose expert pos's domain lacks, in a domain lacking pos's expert
            ok = (dom != dom[pos]) & ~held[dom[pos], e] & ~held[dom, e[pos]]
            if not ok.any():
                break  # more copies than domains: nothing to do
            cand = np.flatnonzero(ok)
            q = int(cand[np.argmin(np.abs(weight[r, flat[cand]] - weight[r, flat[pos]]))])
            flat[pos], flat[q] = flat[q], flat[pos]
        layout[r] = flat.reshape(num_gpus, slots)
    return layout


def _one_slot_layout(weight: FloatArray, expert: IntArray, bins: Bins) -> IntArray:
    """One slot per GPU: balance is fixed by the copy counts; only keep copies apart.

    Items of one expert are adjacent (sorted by expert), and consecutive items go to
    consecutive conflict domains, so copies of an expert land in different domains.
    """
    rows, num_items = weight.shape
    order = np.argsort(expert, axis=1, kind="stable")
    domains = bins.num_domains
    per_domain = bins.num_gpus // domains
    # GPU for position i: domain i % D, the (i // D)-th GPU of that domain
    by_domain = np.argsort(bins.domain, kind="stable").reshape(domains, per_domain)
    pos = np.arange(num_items)
    gpu_for_pos = by_domain[pos % domains, pos // domains]
    layout = np.empty((rows, bins.num_gpus, 1), dtype=np.int64)
    layout[:, gpu_for_pos, 0] = order
    return layout


def gpu_totals(weight: FloatArray, layout: IntArray) -> FloatArray:
    """Load per GPU [B, G] of a layout [B, G, S] for item weights [B, I]."""
    rows, num_gpus, slots = layout.shape
    per_slot = np.take_along_axis(weight, layout.reshape(rows, -1), axis=1)
    out: FloatArray = per_slot.reshape(rows, num_gpus, slots).sum(axis=2)
    return out
