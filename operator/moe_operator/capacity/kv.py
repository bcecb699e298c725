"""KV cache size per token, per GPU, and the cost of moving it between prefill and decode."""

from __future__ import annotations

import math

from ..models.architecture import MoEArchitecture


def kv_bytes_per_token_gqa(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float = 2.0) -> int:
    """Bytes of K and V one token caches in a multi-head or grouped-query model: 2 x L x H_kv x d_h x b."""
    return int(2 * layers * kv_heads * head_dim * bytes_per_element)


def kv_bytes_per_token_mla(
    layers: int, kv_lora_rank: int, qk_rope_head_dim: int, bytes_per_element: float = 2.0
) -> int:
    """Bytes one token caches under MLA: one latent plus one RoPE key per layer, shared by all heads."""
    return int(layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element)


def kv_bytes_per_token_per_gpu(
    arch: MoEArchitecture, attention_tp: int, bytes_per_element: float = 2.0
) -> int:
    """KV bytes one token costs on each GPU of its attention group.

    GQA shards KV heads over the attention TP group until each GPU holds one head, then
    replicates; MLA's latent acts like a single head, so every TP rank holds all of it.
    """
    whole = arch.kv_bytes_per_token(bytes_per_element)
    if arch.attention.kind == "MLA":
        return whole
    shards = min(attention_tp, arch.attention.kv_heads)
    return math.ceil(whole / shards)


def kv_transfer_seconds(tokens: int, kv_bytes_per_token: int, bandwidth_bytes_per_s: float) -> float:
    """Time to copy a prompt's KV cache from prefill to decode: T x kv / beta."""
    return tokens * kv_bytes_per_token / bandwidth_bytes_per_s


def layerwise_transfer_residual(transfer_s: float, prefill_s: float, layers: int) -> float:
    """Transfer time left after prefill when each layer's KV is sent as soon as it is done.

    Roughly the larger of one layer's share and the part that did not fit under compute.
    """
    return max(transfer_s / layers, transfer_s - prefill_s)
