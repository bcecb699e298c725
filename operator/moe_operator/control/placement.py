"""Placement maps and documents: SGLang's trivial map, safety checks, the runtime's JSON document."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np


def trivial_map(num_layers: int, num_experts: int, num_slots: int) -> np.ndarray:
    """SGLang's boot placement: slot p holds expert p % E in every layer."""
    return np.tile(np.arange(num_slots, dtype=np.int64) % num_experts, (num_layers, 1))


def problems(
    phy2log: np.ndarray, num_layers: int, num_experts: int, num_slots: int, num_gpus: int
) -> list[str]:
    """Why a map must not be published (empty when it is safe): shape, ids, a dropped expert."""
    arr = np.asarray(phy2log)
    if arr.shape != (num_layers, num_slots):
        return [f"map shape {list(arr.shape)} != [{num_layers}, {num_slots}]"]
    if num_slots % num_gpus:
        return [f"{num_slots} slots do not divide over {num_gpus} GPUs"]
    if arr.dtype.kind not in "iu":
        return [f"map holds {arr.dtype}, not integers"]
    if arr.min() < 0 or arr.max() >= num_experts:
        return [f"expert ids outside [0, {num_experts})"]
    out = []
    for layer in range(num_layers):
        missing = num_experts - len(np.unique(arr[layer]))
        if missing:
            out.append(f"layer {layer} drops {missing} expert(s)")
    return out


def document(version: int, phy2log: np.ndarray, generated_at: datetime) -> dict[str, Any]:
    """The runtime's placement document (the ConfigMap file and the push body are the same JSON)."""
    return {
        "version": version,
        "generatedAt": generated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "physicalToLogicalMap": np.asarray(phy2log, dtype=np.int64).tolist(),
    }


def moved_slots(new: np.ndarray, old: np.ndarray) -> int:
    return int((np.asarray(new) != np.asarray(old)).sum())
