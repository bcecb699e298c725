"""Does an instance fit its GPUs, and how much KV cache room is left?"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..models.architecture import MoEArchitecture
from .kv import kv_bytes_per_token_per_gpu
from .layout import InstanceLayout
from .weights import WeightBytes, weight_bytes_per_gpu

DEFAULT_USABLE_FRACTION = 0.9
"""Share of GPU memory for weights and KV; the rest goes to the CUDA runtime,
activations, communication buffers and fragmentation (SGLang's --mem-fraction-static)."""

DEFAULT_MIN_KV_TOKENS = 4096
"""KV room each attention data-parallel group must have at least: one 4K-token request."""


@dataclass(frozen=True)
class MemoryFit:
    """Per-GPU memory budget of one instance."""

    usable_bytes: int  # GPU memory x usable fraction
    weights: WeightBytes
    kv_bytes_per_token: int  # on one GPU of an attention group
    min_kv_bytes: int  # KV room the minimum request needs on one GPU

    @property
    def kv_room_bytes(self) -> int:
        """Bytes left for KV cache on one GPU after the weights (negative: weights do not fit)."""
        return self.usable_bytes - self.weights.total

    @property
    def fits(self) -> bool:
        """Weights plus the minimal KV cache fit on every GPU."""
        return self.kv_room_bytes >= self.min_kv_bytes

    @property
    def kv_tokens_per_gpu(self) -> int:
        """Tokens of KV cache one GPU (hence its attention group) can hold."""
        return max(0, self.kv_room_bytes) // self.kv_bytes_per_token


def kv_room_tokens(usable_bytes: float, weight_bytes: float, kv_bytes_per_token: float) -> int:
    """Tokens of KV cache that fit beside the weights: (usable - weights) / kv per token."""
    return max(0, int((usable_bytes - weight_bytes) // kv_bytes_per_token))


def memory_fit(
    arch: MoEArchitecture,
    layout: InstanceLayout,
    gpu_memory_bytes: int,
    bytes_per_param: float,
    kv_bytes_per_element: float = 2.0,
    redundant_experts: int = 0,
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    min_kv_tokens: int = DEFAULT_MIN_KV_TOKENS,
) -> MemoryFit:
    """Per-GPU budget of an instance: weights, KV bytes per token, room left."""
    kv_per_token = kv_bytes_per_token_per_gpu(arch, layout.attention_tp, kv_bytes_per_element)
    return MemoryFit(
        usable_bytes=int(gpu_memory_bytes * usable_fraction),
        weights=weight_bytes_per_gpu(arch, layout, bytes_per_param, redundant_experts),
        kv_bytes_per_token=kv_per_token,
        min_kv_bytes=min_kv_tokens * kv_per_token,
    )


def max_concurrent_tokens(fit: MemoryFit, layout: InstanceLayout) -> int:
    """KV tokens the whole instance holds: each attention DP group caches its own requests."""
    return fit.kv_tokens_per_gpu * layout.attention_dp


def smallest_fitting_nodes(
    arch: MoEArchitecture,
    layout: InstanceLayout,
    gpu_memory_bytes: int,
    bytes_per_param: float,
    kv_bytes_per_element: float = 2.0,
    redundant_experts: int = 0,
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    min_kv_tokens: int = DEFAULT_MIN_KV_TOKENS,
    max_nodes: int = 128,
) -> int | None:
    """Fewest nodes per instance that fit, keeping the attention TP size; None if none up to max_nodes."""
    attention_tp = layout.attention_tp
    for nodes in range(1, max_nodes + 1):
        world = nodes * layout.gpus_per_node
        if world % attention_tp:
            continue
        candidate = replace(layout, nodes=nodes, attention_dp=world // attention_tp)
        fit = memory_fit(
            arch,
            candidate,
            gpu_memory_bytes,
            bytes_per_param,
            kv_bytes_per_element,
            redundant_experts,
            usable_fraction,
            min_kv_tokens,
        )
        if fit.fits:
            return nodes
    return None
