"""Balancedness over the MoE layers only (dense layers have no traffic and would count as 1.0)."""

from __future__ import annotations

import numpy as np

from moe_operator.control.windows import FloatArray
from moe_placement import balancedness


def moe_layers(loads_LE: FloatArray) -> np.ndarray:
    """Mask of layers that routed tokens in these loads."""
    return np.asarray(loads_LE.sum(axis=-1) > 0)


def mean_over_moe(per_layer: FloatArray, loads_LE: FloatArray) -> float:
    mask = moe_layers(loads_LE)
    return float(per_layer[mask].mean()) if mask.any() else 1.0


def measured(
    phy2log: np.ndarray, loads_LE: FloatArray, num_gpus: int, num_nodes: int, dispatch: str
) -> float:
    """SGLang's balancedness of a map on observed traffic, averaged over MoE layers."""
    per_layer = balancedness(phy2log, loads_LE, num_gpus, dispatch, num_nodes=num_nodes)
    return mean_over_moe(per_layer, loads_LE)
