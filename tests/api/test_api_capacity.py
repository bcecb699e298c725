"""The capacity model reproduces every worked example of the seed articles.

Seeds: 000 (MoE inference internals), 001 (tensor, pipeline and expert parallelism),
002 (multi-GPU and multi-node inference), 004 (where all-to-all time goes).
"""

from __future__ import annotations

import pytest

from moe_operator.capacity import (
    InstanceLayout,
    alpha_beta_seconds,
    combine_bytes,
    decode_floor_seconds,
    dispatch_bytes,
    ep_bytes_per_token_per_layer,
    ep_layer_seconds,
    ep_step_seconds,
    expert_slots_per_gpu,
    gpus_needed,
    kv_bytes_per_token_gqa,
    kv_bytes_per_token_mla,
    kv_bytes_per_token_per_gpu,
    kv_room_tokens,
    kv_transfer_seconds,
    layerwise_transfer_residual,
    max_concurrent_tokens,
    memory_fit,
    ring_allreduce_bytes_factor,
    ring_allreduce_seconds,
    smallest_fitting_nodes,
    step_seconds,
    tokens_per_expert,
    tp_allreduce_bytes_per_step,
    two_step_allreduce_seconds,
    weight_bytes,
)
from moe_operator.models import MoEArchitecture, lookup

KIB, MIB, GIB = 2**10, 2**20, 2**30
US, MS = 1e-6, 1e-3
LLAMA_70B_KV = kv_bytes_per_token_gqa(layers=80, kv_heads=8, head_dim=128)


def model(name: str) -> MoEArchitecture:
    arch = lookup(name)
    assert arch is not None
    return arch


# ---------------------------------------------------------------- KV cache per token (seed 001)


def test_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token_mla(61, 512, 64) == 70_272  # DeepSeek-V3, 68.6 KiB
    assert pytest.approx(68.6, abs=0.05) == 70_272 / KIB
    assert model("deepseek-v3").kv_bytes_per_token() == 70_272
    assert LLAMA_70B_KV == 327_680 == 320 * KIB  # Llama 3.1 70B
    assert kv_bytes_per_token_gqa(126, 8, 128) == 504 * KIB  # Llama 3.1 405B
    assert kv_bytes_per_token_gqa(32, 8, 128) == 128 * KIB  # Llama 3.1 8B
    assert kv_bytes_per_token_gqa(64, 72, 128) == 2_359_296  # OPT-66B, full MHA of width 9,216


def test_kv_bytes_per_gpu_follow_attention_sharding() -> None:
    v3, qwen = model("deepseek-v3"), model("qwen3-235b-a22b")
    assert kv_bytes_per_token_per_gpu(v3, attention_tp=8) == 70_272  # MLA latent: copied on every TP rank
    assert kv_bytes_per_token_per_gpu(qwen, attention_tp=2) == qwen.kv_bytes_per_token() // 2
    assert kv_bytes_per_token_per_gpu(qwen, attention_tp=8) == qwen.kv_bytes_per_token() // 4  # 4 KV heads
    assert LLAMA_70B_KV // 8 == 40_960  # seed 002 exercise: TP=8 leaves one KV head per GPU


# ---------------------------------------------------------------- weights, fit and KV room (seed 001)


def test_llama_70b_memory_arithmetic() -> None:
    weights = weight_bytes(70_600_000_000, 2)
    assert weights / 1e9 == pytest.approx(141, abs=0.5)
    cache = LLAMA_70B_KV * 32 * 8192  # 32 conversations of 8,192 tokens
    assert cache == 80 * GIB
    assert (weights + cache) / 1e9 == pytest.approx(227, abs=0.5)
    assert gpus_needed(weights + cache, 0.9 * 80e9) == 4  # four H100s at 90% usable


def test_kv_room_worked_examples() -> None:
    tokens = kv_room_tokens(72e9, 16e9, 128 * KIB)  # Llama 3.1 8B on one H100
    assert tokens == pytest.approx(427_000, rel=0.001)
    assert tokens // 8192 == 52
    per_conversation = LLAMA_70B_KV * 4096
    assert per_conversation == 1.25 * GIB
    assert kv_room_tokens(4 * 72e9, 141e9, per_conversation) == 109  # TP=4: 147 GB left
    assert kv_room_tokens(8 * 72e9, 141e9, per_conversation) == 324  # TP=8: 435 GB left


# ---------------------------------------------------------------- decode floor (seed 001)


def test_decode_floor() -> None:
    llama_70b = weight_bytes(70_600_000_000, 2)
    assert decode_floor_seconds(llama_70b, 2) / MS == pytest.approx(21.1, abs=0.05)
    assert decode_floor_seconds(llama_70b, 8) / MS == pytest.approx(5.3, abs=0.05)
    assert pytest.approx(17.6, abs=0.05) == 141e9 / 8 / 1e9  # each of 8 GPUs reads 17.6 GB
    assert decode_floor_seconds(16e9, 1) / MS == pytest.approx(4.8, abs=0.05)  # Llama 3.1 8B
    assert decode_floor_seconds(16e9, 2) / MS == pytest.approx(2.4, abs=0.05)


def test_tp_decode_step_with_allreduces() -> None:
    """70B at batch 1: read weights + one 4,096-token cache, plus 160 all-reduces of 2 alpha each."""
    weights, cache = weight_bytes(70_600_000_000, 2), LLAMA_70B_KV * 4096
    comm = 160 * 2 * 5 * US
    assert comm / MS == pytest.approx(1.6)
    tp2 = step_seconds((weights + cache) / 2, communication_s=comm)
    tp8 = step_seconds((weights + cache) / 8, communication_s=comm)
    assert tp2 / MS == pytest.approx(22.9, abs=0.05) and tp8 / MS == pytest.approx(6.9, abs=0.05)
    assert step_seconds((weights + cache) / 8, communication_s=160 * 2 * 2 * US) / MS == pytest.approx(
        6.0, abs=0.05
    )
    assert step_seconds((weights + cache) / 8, communication_s=160 * 2 * 10 * US) / MS == pytest.approx(
        8.5, abs=0.05
    )


# ---------------------------------------------------------------- alpha-beta and all-reduce (seeds 001, 002)


def test_alpha_beta() -> None:
    assert alpha_beta_seconds(16_384, 0.0, 450e9) * 1e9 == pytest.approx(36, abs=0.5)
    assert alpha_beta_seconds(16_384, 5 * US, 450e9) == pytest.approx(5 * US + 36.4e-9, rel=1e-3)


def test_tp_allreduce_bytes() -> None:
    assert tp_allreduce_bytes_per_step(layers=24, hidden=896, tokens=1, bytes_per_element=4) == 172_032
    assert 172_032 / KIB == 168  # Qwen2.5-0.5B, 48 all-reduces
    per_call = tp_allreduce_bytes_per_step(80, 8192, 1, 2) / 160  # Llama 3.1 70B: 160 all-reduces
    assert per_call == 16 * KIB
    assert tp_allreduce_bytes_per_step(80, 8192, 64, 2) / 160 == MIB
    # Seed 002 counts what each rank sends and receives: 2 x that, 5.24 MB per step at batch 1.
    both_ways = 2 * tp_allreduce_bytes_per_step(80, 8192, 1, 2)
    assert both_ways == 5_242_880
    assert both_ways / 900e9 / US == pytest.approx(5.8, abs=0.05)  # NVLink
    assert both_ways / 32e9 / US == pytest.approx(163, abs=1)  # PCIe


def test_ring_and_two_step_allreduce() -> None:
    assert [ring_allreduce_bytes_factor(p) for p in (2, 4, 8)] == [1.0, 1.5, 1.75]
    data_only = ring_allreduce_seconds(16_384, 8, 0.0, 450e9)
    assert data_only * 1e9 == pytest.approx(64, abs=0.5)
    assert (ring_allreduce_seconds(16_384, 8, 2 * US, 450e9) - data_only) / US == pytest.approx(28)
    assert (ring_allreduce_seconds(16_384, 8, 10 * US, 450e9) - data_only) / US == pytest.approx(140)
    assert 160 * ring_allreduce_seconds(16_384, 8, 2 * US, 450e9) / MS == pytest.approx(4.5, abs=0.05)
    assert 160 * ring_allreduce_seconds(16_384, 8, 10 * US, 450e9) / MS == pytest.approx(22.4, abs=0.05)
    assert 160 * two_step_allreduce_seconds(16_384, 8, 2 * US, 450e9) / MS == pytest.approx(0.65, abs=0.005)
    assert 160 * two_step_allreduce_seconds(16_384, 8, 10 * US, 450e9) / MS == pytest.approx(3.2, abs=0.05)


# ---------------------------------------------------------------- EP all-to-all (seeds 000, 001, 002, 004)


def test_ep_bytes_deepseek_v3() -> None:
    v3 = model("deepseek-v3")
    per_token_layer = ep_bytes_per_token_per_layer(v3.experts_per_token, v3.hidden_size)  # fp8 out, bf16 back
    assert per_token_layer == 8 * 7_168 * (1 + 2) == 172_032
    assert per_token_layer * v3.moe_layers / 1e6 == pytest.approx(10.0, abs=0.05)
    assert dispatch_bytes(128, 8, 7_168, 1) / 1e6 == pytest.approx(7.34, abs=0.005)
    assert combine_bytes(128, 8, 7_168, 2) / 1e6 == pytest.approx(14.68, abs=0.005)


def test_ep_time_matches_deepep_measurements() -> None:
    """7.34 MB at 98 GB/s ~ 75 us (DeepEP reports 77); 14.68 MB at 127 GB/s ~ 116 us (114)."""
    assert dispatch_bytes(128, 8, 7_168, 1) / 98e9 / US == pytest.approx(75, abs=0.5)
    assert combine_bytes(128, 8, 7_168, 2) / 127e9 / US == pytest.approx(116, abs=0.5)
    layer = ep_layer_seconds(128, 8, 7_168, dispatch_beta=98e9, combine_beta=127e9)
    assert ep_step_seconds(58, layer) / MS == pytest.approx(11.1, rel=0.01)  # modelled: 11.05
    assert ep_step_seconds(58, (77 + 114) * US) / MS == pytest.approx(11.1, abs=0.05)  # EP8, reported times
    assert ep_step_seconds(58, (194 + 360) * US) / MS == pytest.approx(32.1, abs=0.05)  # EP256


def test_ep_bytes_bf16_both_ways() -> None:
    """Seed 000: bf16 dispatch 112 KiB per token, 224 KiB with combine, 13.1 MiB over 60 layers."""
    out = dispatch_bytes(1, 8, 7_168, 2)
    assert out == 114_688 == 112 * KIB
    both = ep_bytes_per_token_per_layer(8, 7_168, 2, 2)
    assert both == 224 * KIB
    assert both * 60 / MIB == pytest.approx(13.1, abs=0.05)
    assert both * 60 / MIB * 8 == pytest.approx(105, abs=0.5)  # x 1,000 tok/s x 8 bits: ~105 Gbps
    assert out / 25e9 / US == pytest.approx(4.5, abs=0.1)  # seed 002: B=1 over 25 GB/s InfiniBand


def test_ep_bytes_512_token_batch() -> None:
    """Seed 002: 512 tokens, bf16: 58.7 MB per all-to-all, two per layer, 58 layers -> 6.8 GB."""
    one = dispatch_bytes(512, 8, 7_168, 2)
    assert one / 1e6 == pytest.approx(58.7, abs=0.05)
    assert 2 * one * 58 / 1e9 == pytest.approx(6.8, abs=0.05)


def test_fixed_cost_round_trips() -> None:
    """Seed 004: 60 MoE layers x 17.4..47.9 us per round trip = 1.0..2.9 ms per token."""
    assert ep_step_seconds(60, 17.4 * US) / MS == pytest.approx(1.0, abs=0.05)
    assert ep_step_seconds(60, 47.9 * US) / MS == pytest.approx(2.9, abs=0.05)


def test_tokens_per_expert() -> None:
    assert tokens_per_expert(8, 8, 256) == 0.25
    assert tokens_per_expert(4, 8, 256) == 0.125
    assert tokens_per_expert(4096 * 4, 8, 256) == 512


# ---------------------------------------------------------------- KV transfer for P/D (seed 001)


def test_kv_transfer() -> None:
    opt = kv_bytes_per_token_gqa(64, 72, 128) * 512
    assert opt == 1_207_959_552 and opt / GIB == 1.125
    assert opt * 10 * 8 / GIB == 90  # Gibit/s at 10 requests per second
    prompt = LLAMA_70B_KV * 8192
    assert prompt == 2.5 * GIB
    one_card = kv_transfer_seconds(8192, LLAMA_70B_KV, 50e9)
    assert one_card / MS == pytest.approx(54, abs=0.5)
    assert kv_transfer_seconds(8192, LLAMA_70B_KV, 450e9) / MS == pytest.approx(6, abs=0.05)
    assert kv_transfer_seconds(8192, LLAMA_70B_KV, 8 * 50e9) / MS == pytest.approx(6.7, abs=0.05)
    assert pytest.approx(0.54, abs=0.005) == 70_272 * 8192 / GIB  # DeepSeek-V3: a fifth of 70B's
    assert layerwise_transfer_residual(one_card, 314 * MS, 80) / MS == pytest.approx(0.67, abs=0.005)


# ---------------------------------------------------------------- MoE instances


def test_expert_slots_of_published_deepseek_layouts() -> None:
    assert expert_slots_per_gpu(256, 32, InstanceLayout(4, 8, 32)) == 9  # EP32 prefill
    assert expert_slots_per_gpu(256, 32, InstanceLayout(9, 8, 72)) == 4  # EP72 decode (LMSYS)
    assert expert_slots_per_gpu(256, 32, InstanceLayout(18, 8, 144)) == 2  # EP144 decode (DeepSeek)
    assert expert_slots_per_gpu(256, 64, InstanceLayout(40, 8, 80)) == 1  # EP320: one expert per GPU


def test_qwen3_30b_fp8_is_about_31_gb() -> None:
    assert weight_bytes(model("qwen3-30b-a3b").total_params, 1) / 1e9 == pytest.approx(31, abs=0.5)


def test_deepseek_v3_needs_two_h100_nodes_but_one_h200_node() -> None:
    v3 = model("deepseek-v3")
    one_node = InstanceLayout(nodes=1, gpus_per_node=8, attention_dp=8)
    assert not memory_fit(v3, one_node, 80 * GIB, 1.0).fits
    assert memory_fit(v3, one_node, 141 * GIB, 1.0).fits
    assert memory_fit(v3, InstanceLayout(2, 8, 16), 80 * GIB, 1.0).fits
    assert smallest_fitting_nodes(v3, one_node, 80 * GIB, 1.0) == 2


def test_deepseek_v3_decode_ep72_budget() -> None:
    v3 = model("deepseek-v3")
    layout = InstanceLayout(nodes=9, gpus_per_node=8, attention_dp=72)
    fit = memory_fit(v3, layout, 80 * GIB, 1.0, redundant_experts=32)
    assert fit.weights.expert_slots_per_gpu == 4
    assert fit.weights.experts == 4 * 58 * 3 * 7168 * 2048
    assert fit.weights.dense == v3.total_params - v3.routed_expert_params  # attention TP 1: not split
    assert fit.kv_tokens_per_gpu == fit.kv_room_bytes // 70_272 > 500_000
    assert max_concurrent_tokens(fit, layout) == 72 * fit.kv_tokens_per_gpu


def test_layout_derivations() -> None:
    layout = InstanceLayout(nodes=4, gpus_per_node=8, attention_dp=8)
    assert (layout.world, layout.attention_tp, layout.ep_size) == (32, 4, 32)
    assert InstanceLayout(1, 8, 8, expert_parallel=False).ep_size == 1
    with pytest.raises(ValueError):
        InstanceLayout(1, 8, 3)
