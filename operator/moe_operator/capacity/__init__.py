"""Capacity model: memory fit, KV room, decode floor, EP all-to-all bytes and time (pure functions)."""

from .comm import (
    alpha_beta_seconds,
    combine_bytes,
    dispatch_bytes,
    ep_bytes_per_token_per_layer,
    ep_layer_seconds,
    ep_step_seconds,
    ring_allreduce_bytes_factor,
    ring_allreduce_seconds,
    tokens_per_expert,
    tp_allreduce_bytes_per_step,
    two_step_allreduce_seconds,
)
from .decode import decode_floor_seconds, moe_decode_floor_seconds, step_seconds
from .kv import (
    kv_bytes_per_token_gqa,
    kv_bytes_per_token_mla,
    kv_bytes_per_token_per_gpu,
    kv_transfer_seconds,
    layerwise_transfer_residual,
)
from .layout import InstanceLayout
from .memory import (
    DEFAULT_MIN_KV_TOKENS,
    DEFAULT_USABLE_FRACTION,
    MemoryFit,
    kv_room_tokens,
    max_concurrent_tokens,
    memory_fit,
    smallest_fitting_nodes,
)
from .weights import WeightBytes, expert_slots_per_gpu, gpus_needed, weight_bytes, weight_bytes_per_gpu

__all__ = [
    "DEFAULT_MIN_KV_TOKENS",
    "DEFAULT_USABLE_FRACTION",
    "InstanceLayout",
    "MemoryFit",
    "WeightBytes",
    "alpha_beta_seconds",
    "combine_bytes",
    "decode_floor_seconds",
    "dispatch_bytes",
    "ep_bytes_per_token_per_layer",
    "ep_layer_seconds",
    "ep_step_seconds",
    "expert_slots_per_gpu",
    "gpus_needed",
    "kv_bytes_per_token_gqa",
    "kv_bytes_per_token_mla",
    "kv_bytes_per_token_per_gpu",
    "kv_room_tokens",
    "kv_transfer_seconds",
    "layerwise_transfer_residual",
    "max_concurrent_tokens",
    "memory_fit",
    "moe_decode_floor_seconds",
    "ring_allreduce_bytes_factor",
    "ring_allreduce_seconds",
    "smallest_fitting_nodes",
    "step_seconds",
    "tokens_per_expert",
    "tp_allreduce_bytes_per_step",
    "two_step_allreduce_seconds",
    "weight_bytes",
    "weight_bytes_per_gpu",
]
