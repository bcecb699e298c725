"""spec.model: which model, in which precision, from where; its architecture when not in the catalog."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import APIObject, cel, rules
from .types import EmbeddedObject, ParamCount


class AttentionArchitecture(APIObject):
    """Attention shape of a model that is not in the catalog; sets its KV bytes per token."""

    model_config = rules(
        cel(
            "self.type == 'GQA' ? has(self.kvHeads) : (has(self.kvLoraRank) && has(self.qkRopeHeadDim))",
            "GQA attention needs kvHeads; MLA attention needs kvLoraRank and qkRopeHeadDim",
        )
    )

    type: Literal["MLA", "GQA"] = Field(
        description="Attention kind. MLA (DeepSeek-style multi-head latent attention) caches one "
        "compressed latent per layer shared by all heads; GQA (grouped-query, also plain multi-head "
        "attention) caches a key and a value for every KV head."
    )
    kv_heads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GQA only: number of key-value heads (config.json num_key_value_heads). Attention "
        "tensor parallelism shards the KV cache over at most this many GPUs.",
    )
    head_dim: int = Field(
        default=128, ge=1, le=1024, description="GQA only: size of one attention head (config.json head_dim)."
    )
    kv_lora_rank: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="MLA only: width of the compressed latent KV (config.json kv_lora_rank, 512 for "
        "DeepSeek-V3).",
    )
    qk_rope_head_dim: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="MLA only: width of the decoupled RoPE key cached next to the latent "
        "(config.json qk_rope_head_dim, 64 for DeepSeek-V3).",
    )


class ModelArchitecture(APIObject):
    """Architecture facts of a model the operator's catalog does not know."""

    model_config = rules(
        cel("self.denseLayers < self.layers", "denseLayers must be smaller than layers", ".denseLayers"),
        cel(
            "self.expertsPerToken <= self.routedExperts",
            "expertsPerToken (top-k) cannot exceed routedExperts",
            ".expertsPerToken",
        ),
        cel("self.topkGroups <= self.expertGroups", "topkGroups cannot exceed expertGroups", ".topkGroups"),
        cel(
            "self.routedExperts % self.expertGroups == 0",
            "routedExperts must be a multiple of expertGroups",
            ".expertGroups",
        ),
    )

    layers: int = Field(
        ge=1, le=1024, description="Transformer layers (config.json num_hidden_layers), MTP layers excluded."
    )
    dense_layers: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Leading layers with a dense FFN instead of experts (config.json first_k_dense_replace). "
        "MoE layers = layers - denseLayers.",
    )
    routed_experts: int = Field(
        ge=2,
        le=4096,
        description="Routed experts per MoE layer (n_routed_experts / num_experts / num_local_experts).",
    )
    shared_experts: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Always-active experts per MoE layer (n_shared_experts); never dispatched.",
    )
    experts_per_token: int = Field(
        ge=1, le=64, description="Experts each token is routed to (top-k, num_experts_per_tok)."
    )
    expert_groups: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Expert groups for node-limited routing (config.json n_group); 1 means no groups. "
        "Hierarchical placement keeps a group's experts on one node.",
    )
    topk_groups: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Groups a token may draw its experts from (config.json topk_group).",
    )
    hidden_size: int = Field(ge=1, le=65536, description="Model width d (config.json hidden_size).")
    moe_intermediate_size: int = Field(
        ge=1, le=131072, description="FFN width of one routed expert (config.json moe_intermediate_size)."
    )
    total_parameters: ParamCount = Field(
        description="Total parameters, as an integer or with a K/M/B/T suffix (powers of 1000), "
        "for example 671B. Sets the weight bytes of everything that is not a routed expert."
    )
    active_parameters: ParamCount | None = Field(
        default=None, description="Parameters used per token (informational), for example 37B."
    )
    native_dtype: Literal["bf16", "fp16", "fp8", "fp4"] = Field(
        default="bf16",
        description="Precision of the published checkpoint; used when spec.model.dtype is auto.",
    )
    dense_intermediate_size: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Width of the dense FFN layers (config.json intermediate_size; 18432 for DeepSeek-V3). "
        "With denseLayers and an FP8 block-quantised checkpoint, the operator checks that the dense FFN's "
        "tensor-parallel split keeps whole blocks on every GPU, as SGLang does at weight load.",
    )
    fp8_block_size: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="Block of an FP8 block-quantised checkpoint, [rows, columns] (config.json "
        "quantization_config.weight_block_size; [128, 128] for DeepSeek-V3). Unset: not block-quantised.",
    )
    attention: AttentionArchitecture = Field(
        description="Attention shape, which sets the KV cache bytes per token."
    )


class ModelSpec(APIObject):
    """The model to serve and where its weights come from."""

    model_config = rules(
        cel(
            "!has(self.volume) || has(self.path)",
            "spec.model.path is required when spec.model.volume is set: set it to where the weights are "
            "found inside the mounted volume",
            ".path",
            "FieldValueRequired",
        ),
        cel(
            "has(self.architecture) == has(oldSelf.architecture)",
            "spec.model.architecture cannot be added or removed in place; create a new MoEDeployment",
            ".architecture",
        ),
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Hugging Face model id (for example deepseek-ai/DeepSeek-V3) or a catalog alias "
        "(deepseek-v3, kimi-k2, qwen3-235b-a22b, ...), matched case-insensitively. The catalog supplies "
        "layers, experts, top-k and KV bytes per token; a model outside it needs spec.model.architecture. "
        "Immutable: another model means new pods everywhere, so create a new MoEDeployment.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "spec.model.name is immutable: serving another model replaces every pod; "
                    "create a new MoEDeployment instead",
                )
            ]
        },
    )
    dtype: Literal["auto", "bf16", "fp16", "fp8", "fp4"] = Field(
        default="auto",
        description="Precision the weights are stored in (bytes per parameter for capacity planning: "
        "bf16/fp16 2, fp8 1, fp4 0.5). auto takes the checkpoint's native precision from the catalog or "
        "from architecture.nativeDtype (fp8 for DeepSeek-V3 and Kimi-K2). The checkpoint must already be "
        "in this precision, or the engine must quantize it on load (--quantization in engine.extraArgs).",
    )
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto",
        description="Precision of the KV cache (SGLang --kv-cache-dtype). auto keeps the activations' "
        "precision (bf16, 2 bytes per number); fp8 halves the cache and doubles the tokens that fit.",
    )
    path: str | None = Field(
        default=None,
        pattern=r"^/",
        max_length=1024,
        description="Absolute directory holding the weights inside the engine container (passed as "
        "--model-path). Required with volume, which is mounted read-only at this path. Without volume "
        "and path, each pod downloads spec.model.name from Hugging Face at start-up.",
    )
    volume: EmbeddedObject | None = Field(
        default=None,
        description="Where the weights live: any Kubernetes volume source (persistentVolumeClaim, "
        "hostPath, nfs, csi, image, ...), exactly one of them, mounted read-only at path on every pod "
        "of every pool. A ReadOnlyMany PVC or node-local copies avoid every node pulling hundreds of GB.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="Architecture facts for a model outside the catalog (required then). For a catalog "
        "model it overrides the catalog entry. Immutable once set.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self == oldSelf", "spec.model.architecture is immutable; create a new MoEDeployment")
            ]
        },
    )
