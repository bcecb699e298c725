"""Weight bytes each GPU of an instance holds.

Routed experts are sharded by expert parallelism: each GPU holds (experts + redundant) /
EP whole experts per MoE layer. Everything else (attention, embeddings, shared experts,
dense FFN layers) is split over the attention TP group and replicated across attention
data-parallel groups. That is conservative: SGLang may shard some dense parts wider.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..models.architecture import MoEArchitecture
from .layout import InstanceLayout


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes on one GPU, split by what shards them."""

    experts: int
    dense: int
    expert_slots_per_gpu: float  # physical expert slots per MoE layer on one GPU

    @property
    def total(self) -> int:
        return self.experts + self.dense


def expert_slots_per_gpu(routed_experts: int, redundant_experts: int, layout: InstanceLayout) -> float:
    """Physical expert slots per MoE layer on one GPU (whole experts under EP, a fraction under TP)."""
    if layout.ep_size > 1:
        return float(math.ceil((routed_experts + redundant_experts) / layout.ep_size))
    return routed_experts / layout.world


def weight_bytes_per_gpu(
    arch: MoEArchitecture,
    layout: InstanceLayout,
    bytes_per_param: float,
    redundant_experts: int = 0,
) -> WeightBytes:
    """Weight bytes one GPU of ``layout`` holds for ``arch`` stored at ``bytes_per_param``."""
    slots = expert_slots_per_gpu(arch.routed_experts, redundant_experts, layout)
    experts = int(arch.moe_layers * slots * arch.params_per_expert * bytes_per_param)
    dense = int(arch.dense_params * bytes_per_param / layout.attention_tp)
    return WeightBytes(experts=experts, dense=dense, expert_slots_per_gpu=slots)


def weight_bytes(params: int, bytes_per_param: float) -> int:
    """Bytes of a whole model: N x b_w."""
    return int(params * bytes_per_param)


def gpus_needed(total_bytes: float, usable_bytes_per_gpu: float) -> int:
    """Fewest GPUs whose usable memory holds ``total_bytes`` (weights plus KV)."""
    return max(1, math.ceil(total_bytes / usable_bytes_per_gpu))
