"""Reading a placement ConfigMap back (pure): the version it holds, and whether it may be adopted.

Anyone with write access to the namespace can edit the live ConfigMap (a rollback does, by design),
so what comes back is checked like any peer's input: the document's envelope with its bounds
(moe_placement.document) and the map against the pool's shape (the one expert-map validator).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moe_operator.api import keys as K
from moe_operator.control.evaluate import PoolShape
from moe_placement import document
from moe_placement.maps import map_problems


@dataclass(frozen=True)
class StoredPlacement:
    """One placement ConfigMap as read back."""

    version: int | None  # None when the document is unreadable
    phy2log: np.ndarray | None  # set only when it may be adopted
    doc: dict[str, Any] = field(default_factory=dict)
    paused: str = ""  # the pause annotation of a rollback ('' when not paused)
    generated_at: float | None = None
    problems: tuple[str, ...] = ()
    # the map is well formed but placed for another pool shape (its slots per layer, or its GPU
    # count, before spec.eplb.redundantExperts or the width changed): not adopted, and no fault
    other_shape: bool = False


def read_stored(cm: Mapping[str, Any], shape: PoolShape, now: float) -> StoredPlacement:
    annotations = (cm.get("metadata") or {}).get("annotations") or {}
    paused = str(annotations.get(K.PLACEMENT_PAUSED) or "")
    try:
        doc = json.loads((cm.get("data") or {}).get("placement.json") or "{}")
        parsed = document.parse(doc, now=now)
    except (ValueError, TypeError, RecursionError) as exc:
        return StoredPlacement(
            None, None, paused=paused, problems=(f"not a placement document: {exc}"[:200],)
        )
    problems = tuple(shape.problems(parsed.physical_to_logical_map))
    if problems:
        other = placed_for_another_shape(parsed.physical_to_logical_map, shape)
        return StoredPlacement(parsed.version, None, doc, paused, parsed.generated_at, problems, other)
    arr = np.asarray(parsed.physical_to_logical_map, dtype=np.int64)
    return StoredPlacement(parsed.version, arr, doc, paused, parsed.generated_at)


def placed_for_another_shape(phy2log: np.ndarray, shape: PoolShape) -> bool:
    """A valid map of the pool's model, for another number of slots or GPUs (one it had before)."""
    if phy2log.ndim != 2 or phy2log.shape[0] != shape.num_layers or phy2log.shape[1] < shape.num_experts:
        return False
    rules = {
        "num_layers": shape.num_layers,
        "num_logical": shape.num_experts,
        "num_physical": phy2log.shape[1],
    }
    return not map_problems(phy2log, **rules)
