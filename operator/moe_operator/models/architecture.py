"""The facts of one MoE model that placement and capacity planning depend on.

Values mirror the model's published ``config.json`` (Hugging Face field names in the
comments) so that anyone can check an entry against its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AttentionKind = Literal["MLA", "GQA"]
Dtype = Literal["bf16", "fp16", "fp8", "fp4"]

BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp4": 0.5,
}


@dataclass(frozen=True)
class Attention:
    """Attention shape; decides how many bytes of KV cache one token costs."""

    kind: AttentionKind
    num_heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (GQA); MLA caches one latent shared by all heads
    head_dim: int  # head_dim (GQA) / qk_nope_head_dim (MLA, informational)
    kv_lora_rank: int = 0  # MLA: width of the compressed latent KV
    qk_rope_head_dim: int = 0  # MLA: width of the decoupled RoPE key

    def kv_elements_per_layer(self) -> int:
        """Numbers cached per token per layer: MLA latent + RoPE key, or K and V of every KV head."""
        if self.kind == "MLA":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class MoEArchitecture:
    """One Mixture-of-Experts model as the operator sees it."""

    name: str  # Hugging Face repository id
    layers: int  # num_hidden_layers (MTP / next-n layers excluded)
    dense_layers: int  # first_k_dense_replace: leading layers with a dense FFN instead of experts
    routed_experts: int  # n_routed_experts / num_experts / num_local_experts
    shared_experts: int  # n_shared_experts: always-on experts, never dispatched
    experts_per_token: int  # num_experts_per_tok (top-k)
    hidden_size: int
    moe_intermediate_size: int  # width of one routed expert's FFN
    total_params: int  # published total parameter count
    active_params: int  # published parameters used per token
    attention: Attention
    native_dtype: Dtype = "bf16"  # precision of the published checkpoint
    expert_groups: int = 1  # n_group: node-limited routing groups (1 = none)
    topk_groups: int = 1  # topk_group: groups a token may draw experts from
    vocab_size: int = 0
    max_context: int = 0  # max_position_embeddings
    aliases: tuple[str, ...] = field(default=())
    intermediate_size: int = 0  # intermediate_size: width of the dense FFN layers (0 = not known)
    fp8_block: tuple[int, int] | None = None  # quantization_config.weight_block_size of the fp8 checkpoint

    def dense_tp_fits(self, tp: int) -> bool:
        """Whether the dense FFN split over ``tp`` GPUs keeps whole FP8 blocks on each: SGLang 0.5.23
        refuses the split at weight load otherwise (layers/quantization/fp8.py,
        Fp8LinearMethod.validate_block_quant_shapes). True when nothing is known to break."""
        if self.dense_layers == 0 or self.fp8_block is None or not self.intermediate_size or tp <= 1:
            return True
        if self.intermediate_size % tp:
            return False
        block_n, block_k = self.fp8_block
        shard = self.intermediate_size // tp
        return shard % block_n == 0 and shard % block_k == 0

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is a routed-expert layer (the layers EPLB places)."""
        return self.layers - self.dense_layers

    @property
    def params_per_expert(self) -> int:
        """One routed expert of one layer: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of all MoE layers: the part expert parallelism shards."""
        return self.moe_layers * self.routed_experts * self.params_per_expert

    @property
    def dense_params(self) -> int:
        """Everything else (attention, embeddings, shared experts, dense FFN layers, norms)."""
        return self.total_params - self.routed_expert_params

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> int:
        """KV cache bytes one token costs over all layers (whole model, unsharded)."""
        return int(self.layers * self.attention.kv_elements_per_layer() * bytes_per_element)
