"""Catalog facts against the published config.json values."""

from __future__ import annotations

import pytest

from moe_operator.models import CATALOG, MoEArchitecture, lookup


def get(name: str) -> MoEArchitecture:
    arch = lookup(name)
    assert arch is not None, name
    return arch


def test_deepseek_v3() -> None:
    arch = get("deepseek-ai/DeepSeek-V3")
    assert (arch.layers, arch.dense_layers, arch.moe_layers) == (61, 3, 58)
    assert (arch.routed_experts, arch.shared_experts, arch.experts_per_token) == (256, 1, 8)
    assert (arch.expert_groups, arch.topk_groups) == (8, 4)
    assert (arch.hidden_size, arch.moe_intermediate_size) == (7168, 2048)
    assert arch.attention.kind == "MLA" and arch.attention.kv_elements_per_layer() == 576
    assert arch.kv_bytes_per_token(2) == 61 * 576 * 2 == 70_272
    assert arch.native_dtype == "fp8" and arch.total_params == 671e9 and arch.active_params == 37e9
    assert get("deepseek-ai/DeepSeek-R1").routed_experts == 256


@pytest.mark.parametrize(
    ("name", "layers", "moe_layers", "experts", "shared", "top_k", "hidden", "moe_inter", "kind", "kv_bytes"),
    [
        ("moonshotai/Kimi-K2-Instruct", 61, 60, 384, 1, 8, 7168, 2048, "MLA", 70_272),
        ("Qwen/Qwen3-235B-A22B", 94, 94, 128, 0, 8, 4096, 1536, "GQA", 2 * 94 * 4 * 128 * 2),
        ("Qwen/Qwen3-30B-A3B", 48, 48, 128, 0, 8, 2048, 768, "GQA", 2 * 48 * 4 * 128 * 2),
        ("mistralai/Mixtral-8x7B-v0.1", 32, 32, 8, 0, 2, 4096, 14336, "GQA", 131_072),
        ("mistralai/Mixtral-8x22B-v0.1", 56, 56, 8, 0, 2, 6144, 16384, "GQA", 229_376),
        ("allenai/OLMoE-1B-7B-0924", 16, 16, 64, 0, 8, 2048, 1024, "GQA", 131_072),
        ("zai-org/GLM-4.5", 92, 89, 160, 1, 8, 5120, 1536, "GQA", 2 * 92 * 8 * 128 * 2),
        ("zai-org/GLM-4.5-Air", 46, 45, 128, 1, 8, 4096, 1408, "GQA", 2 * 46 * 8 * 128 * 2),
        ("deepseek-ai/DeepSeek-V2-Lite", 27, 26, 64, 2, 6, 2048, 1408, "MLA", 27 * 576 * 2),
    ],
)
def test_model_facts(
    name: str,
    layers: int,
    moe_layers: int,
    experts: int,
    shared: int,
    top_k: int,
    hidden: int,
    moe_inter: int,
    kind: str,
    kv_bytes: int,
) -> None:
    arch = get(name)
    assert (arch.layers, arch.moe_layers, arch.routed_experts, arch.shared_experts) == (
        layers,
        moe_layers,
        experts,
        shared,
    )
    assert (arch.experts_per_token, arch.hidden_size, arch.moe_intermediate_size) == (
        top_k,
        hidden,
        moe_inter,
    )
    assert arch.attention.kind == kind and arch.kv_bytes_per_token(2) == kv_bytes


def test_groups_only_where_published() -> None:
    grouped = {a.name for a in CATALOG if a.expert_groups > 1}
    assert grouped == {
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-V3-0324",
        "deepseek-ai/DeepSeek-R1",
        "deepseek-ai/DeepSeek-R1-0528",
    }


@pytest.mark.parametrize("arch", CATALOG, ids=lambda a: a.name)
def test_parameter_counts_are_consistent(arch: MoEArchitecture) -> None:
    """Routed experts fit inside the total, and dense + top-k experts is about the active count."""
    assert 0 < arch.dense_params < 0.1 * arch.total_params
    active = arch.dense_params + arch.moe_layers * arch.experts_per_token * arch.params_per_expert
    assert active == pytest.approx(arch.active_params, rel=0.15)
    assert arch.routed_experts % arch.expert_groups == 0 and arch.topk_groups <= arch.expert_groups


def test_lookup_by_name_alias_and_case() -> None:
    v3 = get("deepseek-ai/DeepSeek-V3")
    assert lookup("DEEPSEEK-AI/deepseek-v3") is v3 and lookup("deepseek-v3") is v3 and lookup(" dsv3 ") is v3
    assert lookup("kimi-k2") is get("moonshotai/Kimi-K2-Instruct")
    assert lookup("qwen3-235b-a22b") is get("Qwen/Qwen3-235B-A22B")
    assert lookup("mixtral-8x22b") is get("mistralai/Mixtral-8x22B-v0.1")
    assert lookup("olmoe") is get("allenai/OLMoE-1B-7B-0924")
    assert lookup("glm-4.5") is get("zai-org/GLM-4.5")
    assert lookup("acme/unknown") is None


def test_aliases_are_unique() -> None:
    keys = [k.lower() for a in CATALOG for k in (a.name, *a.aliases)]
    assert len(keys) == len(set(keys))
