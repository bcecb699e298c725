"""Known MoE models, looked up by Hugging Face name or short alias.

Numbers are the published config.json values; total/active parameters are the model
cards' figures (checked against the sum over config.json: DeepSeek-V3 comes to 671.0B).
``intermediate_size`` and ``fp8_block`` (quantization_config.weight_block_size) are read from
the published config.json of the model (and of its FP8 checkpoint), as DeepSeek's own
inference config (inference/configs/config_671B.json: inter_dim 18432) also states for V3.
Add a model here, or describe it in ``spec.model.architecture``.
"""

from __future__ import annotations

from dataclasses import replace

from .architecture import Attention, MoEArchitecture

_DEEPSEEK_V3_MLA = Attention(
    kind="MLA", num_heads=128, kv_heads=1, head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64
)


def _deepseek_v3_like(name: str, aliases: tuple[str, ...]) -> MoEArchitecture:
    return MoEArchitecture(
        name=name,
        layers=61,
        dense_layers=3,
        routed_experts=256,
        shared_experts=1,
        experts_per_token=8,
        expert_groups=8,
        topk_groups=4,
        hidden_size=7168,
        moe_intermediate_size=2048,
        total_params=671_000_000_000,
        active_params=37_000_000_000,
        attention=_DEEPSEEK_V3_MLA,
        native_dtype="fp8",
        vocab_size=129280,
        max_context=163840,
        aliases=aliases,
        intermediate_size=18432,
        fp8_block=(128, 128),
    )


_QWEN3_235B = MoEArchitecture(
    name="Qwen/Qwen3-235B-A22B",
    layers=94,
    dense_layers=0,
    routed_experts=128,
    shared_experts=0,
    experts_per_token=8,
    hidden_size=4096,
    moe_intermediate_size=1536,
    total_params=235_000_000_000,
    active_params=22_000_000_000,
    attention=Attention(kind="GQA", num_heads=64, kv_heads=4, head_dim=128),
    vocab_size=151936,
    max_context=40960,
    aliases=("qwen3-235b-a22b", "qwen3-235b", "Qwen/Qwen3-235B-A22B-Instruct-2507"),
    intermediate_size=12288,
)


CATALOG: tuple[MoEArchitecture, ...] = (
    _deepseek_v3_like("deepseek-ai/DeepSeek-V3", ("deepseek-v3", "dsv3")),
    _deepseek_v3_like("deepseek-ai/DeepSeek-V3-0324", ("deepseek-v3-0324",)),
    _deepseek_v3_like("deepseek-ai/DeepSeek-R1", ("deepseek-r1", "dsr1")),
    _deepseek_v3_like("deepseek-ai/DeepSeek-R1-0528", ("deepseek-r1-0528",)),
    MoEArchitecture(
        name="deepseek-ai/DeepSeek-V2-Lite",
        layers=27,
        dense_layers=1,
        routed_experts=64,
        shared_experts=2,
        experts_per_token=6,
        hidden_size=2048,
        moe_intermediate_size=1408,
        total_params=15_700_000_000,
        active_params=2_400_000_000,
        attention=Attention(
            kind="MLA", num_heads=16, kv_heads=1, head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64
        ),
        vocab_size=102400,
        max_context=163840,
        aliases=("deepseek-v2-lite",),
    ),
    MoEArchitecture(
        name="moonshotai/Kimi-K2-Instruct",
        layers=61,
        dense_layers=1,
        routed_experts=384,
        shared_experts=1,
        experts_per_token=8,
        hidden_size=7168,
        moe_intermediate_size=2048,
        # The card says 1T and the report 1.04T; the sum over config.json is 1.026T, used here so
        # that the non-expert part (attention, embeddings, shared experts: ~11.6B) comes out right.
        total_params=1_026_000_000_000,
        active_params=32_000_000_000,
        attention=Attention(
            kind="MLA", num_heads=64, kv_heads=1, head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64
        ),
        native_dtype="fp8",
        vocab_size=163840,
        max_context=131072,
        aliases=("kimi-k2", "kimi-k2-instruct", "moonshotai/Kimi-K2-Base"),
        intermediate_size=18432,
        fp8_block=(128, 128),
    ),
    _QWEN3_235B,
    # The same model as published in FP8 (its quantization_config: weight_block_size [128, 128]).
    replace(
        _QWEN3_235B,
        name="Qwen/Qwen3-235B-A22B-FP8",
        native_dtype="fp8",
        aliases=("qwen3-235b-a22b-fp8", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"),
        fp8_block=(128, 128),
    ),
    MoEArchitecture(
        name="Qwen/Qwen3-30B-A3B",
        layers=48,
        dense_layers=0,
        routed_experts=128,
        shared_experts=0,
        experts_per_token=8,
        hidden_size=2048,
        moe_intermediate_size=768,
        total_params=30_500_000_000,
        active_params=3_300_000_000,
        attention=Attention(kind="GQA", num_heads=32, kv_heads=4, head_dim=128),
        vocab_size=151936,
        max_context=40960,
        aliases=("qwen3-30b-a3b", "qwen3-30b", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
        intermediate_size=6144,
    ),
    MoEArchitecture(
        name="mistralai/Mixtral-8x7B-v0.1",
        layers=32,
        dense_layers=0,
        routed_experts=8,
        shared_experts=0,
        experts_per_token=2,
        hidden_size=4096,
        moe_intermediate_size=14336,
        total_params=46_700_000_000,
        active_params=12_900_000_000,
        attention=Attention(kind="GQA", num_heads=32, kv_heads=8, head_dim=128),
        vocab_size=32000,
        max_context=32768,
        aliases=("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
        intermediate_size=14336,
    ),
    MoEArchitecture(
        name="mistralai/Mixtral-8x22B-v0.1",
        layers=56,
        dense_layers=0,
        routed_experts=8,
        shared_experts=0,
        experts_per_token=2,
        hidden_size=6144,
        moe_intermediate_size=16384,
        total_params=141_000_000_000,
        active_params=39_000_000_000,
        attention=Attention(kind="GQA", num_heads=48, kv_heads=8, head_dim=128),
        vocab_size=32768,
        max_context=65536,
        aliases=("mixtral-8x22b", "mistralai/Mixtral-8x22B-Instruct-v0.1"),
    ),
    MoEArchitecture(
        name="allenai/OLMoE-1B-7B-0924",
        layers=16,
        dense_layers=0,
        routed_experts=64,
        shared_experts=0,
        experts_per_token=8,
        hidden_size=2048,
        moe_intermediate_size=1024,
        total_params=6_900_000_000,
        active_params=1_300_000_000,
        attention=Attention(kind="GQA", num_heads=16, kv_heads=16, head_dim=128),
        vocab_size=50304,
        max_context=4096,
        aliases=("olmoe-1b-7b", "olmoe", "allenai/OLMoE-1B-7B-0924-Instruct"),
    ),
    MoEArchitecture(
        name="zai-org/GLM-4.5",
        layers=92,
        dense_layers=3,
        routed_experts=160,
        shared_experts=1,
        experts_per_token=8,
        hidden_size=5120,
        moe_intermediate_size=1536,
        total_params=355_000_000_000,  # published; includes the MTP layer (~3.9B, speculative decoding)
        active_params=32_000_000_000,
        attention=Attention(kind="GQA", num_heads=96, kv_heads=8, head_dim=128),
        vocab_size=151552,
        max_context=131072,
        aliases=("glm-4.5", "glm4.5", "zai-org/GLM-4.5-FP8", "THUDM/GLM-4.5"),
    ),
    MoEArchitecture(
        name="zai-org/GLM-4.5-Air",
        layers=46,
        dense_layers=1,
        routed_experts=128,
        shared_experts=1,
        experts_per_token=8,
        hidden_size=4096,
        moe_intermediate_size=1408,
        total_params=106_000_000_000,
        active_params=12_000_000_000,
        attention=Attention(kind="GQA", num_heads=96, kv_heads=8, head_dim=128),
        vocab_size=151552,
        max_context=131072,
        aliases=("glm-4.5-air", "glm4.5-air", "zai-org/GLM-4.5-Air-FP8"),
    ),
)


def _index() -> dict[str, MoEArchitecture]:
    index: dict[str, MoEArchitecture] = {}
    for arch in CATALOG:
        for key in (arch.name, *arch.aliases):
            index[key.lower()] = arch
    return index


_INDEX = _index()


def lookup(name: str) -> MoEArchitecture | None:
    """Find a model by Hugging Face name or alias, ignoring case; None when unknown."""
    return _INDEX.get(name.strip().lower())


def known_names() -> list[str]:
    """Canonical names of every catalog entry, for messages and docs."""
    return [arch.name for arch in CATALOG]
