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
    order_new = np.argsort(new, axis=1, kind="stable")
    order_old = np.argsort(old, axis=1, kind="stable")
    key_new = _occurrence_key(np.take_along_axis(new, order_new, axis=1), size)
    key_old = _occurrence_key(np.take_along_axis(old, order_old, axis=1), size)
    # all rows at once: offset each row's keys so one sorted search finds every match
    span = int(max(key_new.max(initial=0), key_old.max(initial=0))) + 1
    offset = (np.arange(rows, dtype=np.int64) * span)[:, None]
    flat_old = (key_old + offset).ravel()  # sorted: keys ascend within a row, rows ascend
    flat_new = (key_new + offset).ravel()
    at = np.minimum(np.searchsorted(flat_old, flat_new), flat_old.size - 1)
    hit = (flat_old[at] == flat_new).reshape(rows, size)  # [B, size] in new's sorted order
    slot_of_hit = order_old.ravel()[at].reshape(rows, size)  # where the matching old copy sits
    out = np.full_like(new, -1)
    r_idx = np.broadcast_to(np.arange(rows)[:, None], (rows, size))
    out[r_idx[hit], slot_of_hit[hit]] = np.take_along_axis(new, order_new, axis=1)[hit]
    # the rest fill the free GPUs in order
    free = out == -1
    rest = np.take_along_axis(new, order_new, axis=1)[~hit]
    out[free] = rest  # both are row-major, with the same count per row
    return out


def _occurrence_key(sorted_ids: IntArray, size: int) -> IntArray:
    """For ids sorted per row, id * size + occurrence index (0 for the first copy, 1 for the next...)."""
    first = np.ones_like(sorted_ids, dtype=bool)
    first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    pos = np.broadcast_to(np.arange(sorted_ids.shape[1]), sorted_ids.shape)
    start = np.maximum.accumulate(np.where(first, pos, 0), axis=1)
    out: IntArray = sorted_ids * size + (pos - start)
    return out
