"""Shape of an expert-parallel deployment and validation of planner inputs.

Every entry point checks its arguments here once, so the algorithms below can assume
consistent shapes and give clear errors instead of numpy broadcasting surprises.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DISPATCH_RULES = ("static", "dynamic")


@dataclass(frozen=True)
class Layout:
    """E logical experts on G GPUs (S slots each) in N nodes; K expert groups."""

    num_layers: int
    num_experts: int
    num_redundant: int
    num_gpus: int
    num_nodes: int
    num_groups: int

    @property
    def num_slots(self) -> int:
        return self.num_experts + self.num_redundant

    @property
    def slots_per_gpu(self) -> int:
        return self.num_slots // self.num_gpus

    @property
    def gpus_per_node(self) -> int:
        return self.num_gpus // self.num_nodes

    @property
    def hierarchical(self) -> bool:
        """DeepSeek's rule: whole expert groups per node when groups divide over nodes."""
        return self.num_nodes > 1 and self.num_groups % self.num_nodes == 0


def make_layout(
    num_layers: int,
    num_experts: int,
    *,
    num_gpus: int,
    num_nodes: int = 1,
    num_redundant: int = 0,
    num_groups: int = 1,
) -> Layout:
    """Check the deployment arithmetic and return its Layout."""
    for name, value, low in (
        ("num_layers", num_layers, 1),
        ("num_experts", num_experts, 1),
        ("num_gpus", num_gpus, 1),
        ("num_nodes", num_nodes, 1),
        ("num_redundant", num_redundant, 0),
        ("num_groups", num_groups, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    slots = num_experts + num_redundant
    if slots % num_gpus:
        raise ValueError(
            f"experts + redundant = {slots} slots do not divide over {num_gpus} GPUs "
            "(each GPU must hold the same number of slots)"
        )
    if num_gpus % num_nodes:
        raise ValueError(f"{num_gpus} GPUs do not divide over {num_nodes} nodes")
    if num_experts % num_groups:
        raise ValueError(f"{num_experts} experts do not divide into {num_groups} groups")
    layout = Layout(
        int(num_layers), int(num_experts), int(num_redundant), int(num_gpus), int(num_nodes), int(num_groups)
    )
    if layout.hierarchical and num_redundant % num_nodes:
        raise ValueError(
            f"hierarchical placement ({num_groups} groups over {num_nodes} nodes) needs the "
            f"{num_redundant} redundant slots to divide over the nodes"
        )
    return layout


def as_history(loads: object) -> FloatArray:
    """Loads as float64 [T, L, E] (a single [L, E] window becomes T = 1)."""
    arr = np.asarray(loads, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"loads must have shape [T, L, E] or [L, E], got {arr.shape}")
    if min(arr.shape) == 0:
        raise ValueError(f"loads must not be empty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("loads must be finite")
    if np.any(arr < 0):
        raise ValueError("loads must be non-negative")
    return arr


def check_dispatch(dispatch: str) -> str:
    if dispatch not in DISPATCH_RULES:
        raise ValueError(f"dispatch must be one of {DISPATCH_RULES}, got {dispatch!r}")
    return dispatch


def check_placement(phy2log: object, layout: Layout, *, name: str = "current") -> IntArray:
    """A [L, E+R] slot -> expert map that keeps every logical expert at least once."""
    arr = np.asarray(phy2log)
    shape = (layout.num_layers, layout.num_slots)
    if arr.shape != shape:
        raise ValueError(
            f"{name} must have shape {list(shape)} (layers, experts + redundant), got {list(arr.shape)}"
        )
    whole = arr.dtype.kind in "iu" or (
        arr.dtype.kind == "f" and bool(np.all(np.isfinite(arr))) and bool(np.all(arr == np.round(arr)))
    )
    if not whole:
        raise ValueError(f"{name} must hold integer expert ids")
    out = arr.astype(np.int64)
    if out.min() < 0 or out.max() >= layout.num_experts:
        raise ValueError(f"{name} holds expert ids outside [0, {layout.num_experts})")
    counts = expert_counts(out, layout.num_experts)
    missing = np.argwhere(counts == 0)
    if missing.size:
        layer, expert = (int(v) for v in missing[0])
        raise ValueError(
            f"{name} drops logical expert {expert} in layer {layer} "
            f"({len(missing)} (layer, expert) pairs without a slot)"
        )
    return out


def expert_counts(phy2log: IntArray, num_experts: int) -> IntArray:
    """Copies of each logical expert per layer, [L, E]."""
    num_layers = phy2log.shape[0]
    offsets = (np.arange(num_layers, dtype=np.int64) * num_experts)[:, None]
    flat = np.bincount((phy2log + offsets).ravel(), minlength=num_layers * num_experts)
    return flat.reshape(num_layers, num_experts).astype(np.int64)


def check_steps(steps: object, shape: tuple[int, ...]) -> FloatArray:
    """Per-step samples [K, L, E] matching the history's layers and experts."""
    arr = as_history(steps)
    if arr.shape[1:] != tuple(shape):
        raise ValueError(f"steps must have shape [K, {shape[0]}, {shape[1]}], got {list(arr.shape)}")
    return arr


def check_prior(prior: object, shape: tuple[int, ...]) -> FloatArray:
    """A prior history (e.g. the pool's) with the same rows, layers and experts as the history."""
    arr = as_history(prior)
    if arr.shape != tuple(shape):
        raise ValueError(f"prior must have the history's shape {list(shape)}, got {list(arr.shape)}")
    return arr
