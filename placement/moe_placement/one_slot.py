"""Placement when every GPU holds one slot (e.g. 256 experts + 32 redundant on 288 GPUs).

Then a GPU's load is simply its expert's load divided by that expert's copies: planning
means choosing the copy counts (solve.py), and, given the current placement, which GPUs
keep their expert (here, exactly).
"""

from __future__ import annotations

import numpy as np

from .layout import IntArray


def keep_positions(new: IntArray, old: IntArray) -> IntArray:
    """Rows of one-slot GPUs: reorder ``new`` [B, G] so that as many GPUs as possible keep their expert.

    Optimal: the r-th copy of expert e in ``new`` goes where the r-th copy of e was.
    """
    rows, size = new.shape
    out = np.full_like(new, -1)
    order_new = np.argsort(new, axis=1, kind="stable")
    order_old = np.argsort(old, axis=1, kind="stable")
    key_new = _occurrence_key(np.take_along_axis(new, order_new, axis=1), size)
    key_old = _occurrence_key(np.take_along_axis(old, order_old, axis=1), size)
    for r in range(rows):
        _, i_new, i_old = np.intersect1d(key_new[r], key_old[r], assume_unique=True, return_indices=True)
        out[r, order_old[r, i_old]] = new[r, order_new[r, i_new]]
        rest_new = np.delete(order_new[r], i_new)
        free = np.flatnonzero(out[r] == -1)
        out[r, free] = new[r, rest_new]
    return out


def _occurrence_key(sorted_ids: IntArray, size: int) -> IntArray:
    """For ids sorted per row, id * size + occurrence index (0 for the first copy, 1 for the next...)."""
    first = np.ones_like(sorted_ids, dtype=bool)
    first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    pos = np.broadcast_to(np.arange(sorted_ids.shape[1]), sorted_ids.shape)
    start = np.maximum.accumulate(np.where(first, pos, 0), axis=1)
    out: IntArray = sorted_ids * size + (pos - start)
    return out
