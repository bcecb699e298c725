"""Relabel a new placement's GPUs and slots so that as few slots as possible change.

GPUs that end up with the same set of experts are interchangeable for balance, so a fresh
plan can be permuted to look like the current one: assign new GPU contents to old GPUs
maximising the experts they share (a linear assignment, solved exactly by a Hungarian
algorithm batched over layers), then keep each shared expert in its old slot.

Which permutations are free depends on the rules the plan follows: within a node always;
whole nodes when the placement is hierarchical (groups stay together); any GPU when the
placement is global and dispatch is dynamic. Static dispatch across nodes keeps GPUs in
their node, because which node holds a copy changes how static dispatch splits tokens.
"""

from __future__ import annotations

import numpy as np

from .layout import FloatArray, IntArray, Layout
from .one_slot import keep_positions

MAX_EXACT = 16  # larger assignment problems use a greedy largest-overlap matching (the exact solver is O(n^3) in Python loops)


def hungarian(cost: FloatArray) -> IntArray:
    """Minimum-cost perfect matching for a batch of square matrices: cost [B, n, n] -> column of each row [B, n].

    Shortest augmenting paths with potentials (O(n^3)), vectorised across the batch; finished
    problems idle while others still search.
    """
    batch, n, _ = cost.shape
    big = np.inf
    a = np.zeros((batch, n + 1, n + 1))
    a[:, 1:, 1:] = cost
    u = np.zeros((batch, n + 1))
    v = np.zeros((batch, n + 1))
    p = np.zeros((batch, n + 1), dtype=np.int64)  # p[j]: row matched to column j (0 = none)
    way = np.zeros((batch, n + 1), dtype=np.int64)
    bidx = np.arange(batch)
    cols = np.arange(n + 1)
    for i in range(1, n + 1):
        p[:, 0] = i
        j0 = np.zeros(batch, dtype=np.int64)
        minv = np.full((batch, n + 1), big)
        used = np.zeros((batch, n + 1), dtype=bool)
        searching = np.ones(batch, dtype=bool)
        while searching.any():
            s = bidx[searching]
            used[s, j0[s]] = True
            i0 = p[s, j0[s]]
            cur = a[s, i0] - u[s, i0][:, None] - v[s]
            free = ~used[s]
            better = free & (cur < minv[s])
            minv_s = np.where(better, cur, minv[s])
            way[s] = np.where(better, j0[s][:, None], way[s])
            cand = np.where(free, minv_s, big)
            cand[:, 0] = big
            j1 = np.argmin(cand, axis=1)
            delta = cand[np.arange(s.size), j1]
            used_s = used[s]
            # potentials: matched rows of used columns rise, used columns fall, others' slack shrinks
            rows_used = np.where(used_s, p[s], 0)
            upd = np.zeros((s.size, n + 1))
            np.add.at(
                upd,
                (np.repeat(np.arange(s.size), n + 1), rows_used.ravel()),
                (used_s * delta[:, None]).ravel(),
            )
            upd[:, 0] = 0.0
            u[s] += upd
            v[s] -= np.where(used_s, delta[:, None], 0.0)
            minv[s] = np.where(used_s, minv_s, minv_s - delta[:, None])
            j0[s] = j1
            searching[s] = p[s, j1] != 0
        # augment along the stored path
        walking = np.ones(batch, dtype=bool)
        while walking.any():
            s = bidx[walking]
            j1 = way[s, j0[s]]
            p[s, j0[s]] = p[s, j1]
            j0[s] = j1
            walking[s] = j1 != 0
    assign = np.empty((batch, n), dtype=np.int64)
    assign[bidx[:, None], p[:, 1:] - 1] = cols[None, 1:] - 1
    return assign


def greedy_match(overlap: FloatArray) -> IntArray:
    """Largest overlap first, for problems too big for the exact solver. overlap [B, n, n]."""
    batch, n, _ = overlap.shape
    work = overlap.astype(np.float64).copy()
    assign = np.full((batch, n), -1, dtype=np.int64)
    bidx = np.arange(batch)
    for _ in range(n):
        flat = np.argmax(work.reshape(batch, -1), axis=1)
        row, col = np.divmod(flat, n)
        assign[bidx, row] = col
        work[bidx, row, :] = -np.inf
        work[bidx, :, col] = -np.inf
    return assign


def assign_max_overlap(overlap: FloatArray) -> IntArray:
    """Rows (new) to columns (old) maximising total overlap."""
    if overlap.shape[1] <= MAX_EXACT:
        return hungarian(overlap.max() - overlap)
    return greedy_match(overlap)


def _counts(sets: IntArray, num_experts: int) -> FloatArray:
    """[B, n, k] expert ids -> [B, n, E] counts."""
    batch, n, _ = sets.shape
    cell = (np.arange(batch * n) * num_experts).reshape(batch, n, 1) + sets  # flat (b, group, expert)
    out: FloatArray = np.bincount(cell.ravel(), minlength=batch * n * num_experts).astype(np.float64)
    return out.reshape(batch, n, num_experts)


def _overlap(new: IntArray, old: IntArray, num_experts: int) -> FloatArray:
    """Distinct experts shared by every new and old group: [B, n, n] (a batched matrix product)."""
    cn = np.minimum(_counts(new, num_experts), 1.0)
    co = np.minimum(_counts(old, num_experts), 1.0)
    out: FloatArray = cn @ co.transpose(0, 2, 1)
    return out


def _permute_groups(new: IntArray, old: IntArray, num_experts: int) -> IntArray:
    """Reorder groups (axis 1) of ``new`` [B, n, k] so group j lands where old group j is."""
    if new.shape[2] == 1:  # one slot per GPU: matching by expert id is optimal
        return keep_positions(new[..., 0], old[..., 0])[..., None]
    assign = assign_max_overlap(_overlap(new, old, num_experts))
    out = np.empty_like(new)
    out[np.arange(new.shape[0])[:, None], assign] = new
    return out


def align_slots(new: IntArray, old: IntArray) -> IntArray:
    """Within each GPU [..., S], keep experts that stay on it in their old slot."""
    shape = new.shape
    slots = shape[-1]
    new2 = new.reshape(-1, slots).copy()
    old2 = old.reshape(-1, slots)
    out = np.full_like(new2, -1)
    taken = np.zeros_like(new2, dtype=bool)
    rows = np.arange(new2.shape[0])
    for s in range(slots):
        hit = (new2 == old2[:, s : s + 1]) & ~taken
        has = hit.any(axis=1)
        t = np.argmax(hit, axis=1)
        out[rows[has], s] = old2[has, s]
        taken[rows[has], t[has]] = True
    # remaining experts fill the remaining slots in order
    rest_order = np.argsort(taken, axis=1, kind="stable")  # untaken first
    rest = np.take_along_axis(new2, rest_order, axis=1)
    free_order = np.argsort(out != -1, axis=1, kind="stable")  # free slots first
    num_free = (out == -1).sum(axis=1)
    fill = np.arange(slots)[None, :] < num_free[:, None]
    for k in range(slots):
        sel = fill[:, k]
        out[rows[sel], free_order[sel, k]] = rest[sel, k]
    return out.reshape(shape)


def match_to_current(new: IntArray, current: IntArray, layout: Layout, dispatch: str) -> IntArray:
    """Permute ``new`` [L, P] within the freedoms of its rules to change as few slots as possible."""
    num_layers, num_experts = layout.num_layers, layout.num_experts
    nodes, per_node, slots = layout.num_nodes, layout.gpus_per_node, layout.slots_per_gpu
    new4 = new.reshape(num_layers, nodes, per_node, slots)
    cur4 = current.reshape(num_layers, nodes, per_node, slots)
    if layout.hierarchical and nodes > 1:
        new4 = _permute_groups(
            new4.reshape(num_layers, nodes, -1), cur4.reshape(num_layers, nodes, -1), num_experts
        )
        new4 = new4.reshape(num_layers, nodes, per_node, slots)
    elif not (dispatch == "static" and nodes > 1):
        flat = _permute_groups(
            new.reshape(num_layers, -1, slots), current.reshape(num_layers, -1, slots), num_experts
        )
        return align_slots(flat, current.reshape(num_layers, -1, slots)).reshape(num_layers, -1)
    # GPUs within each node
    inner = _permute_groups(
        new4.reshape(num_layers * nodes, per_node, slots),
        cur4.reshape(num_layers * nodes, per_node, slots),
        num_experts,
    )
    return align_slots(inner, cur4.reshape(num_layers * nodes, per_node, slots)).reshape(num_layers, -1)
