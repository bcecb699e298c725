"""The recipe's rules and checks, pure: what each derives, what the user overrides, what is refused.

The behaviour against SGLang's own code is in tests/runtime/test_recipe_sglang.py; here, each rule
in isolation, with inputs chosen to make it fire and not fire.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.hardware import load_profiles
from moe_operator.recipe import derive_pool, effective_args, effective_env, recipe_findings, startup_timeout_s
from moe_operator.recipe.explain import explain
from moe_operator.validation import validate, warnings

REPO = Path(__file__).resolve().parents[2]


def example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "examples" / name).read_text())["spec"])


H100 = example("deepseek-v3-pd-h100.yaml")
GB200 = example("deepseek-v3-gb200.yaml")


def spec_of(raw: dict[str, Any]) -> MoEDeploymentSpec:
    return MoEDeploymentSpec.model_validate(raw)


def with_(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    node = out
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def refusals(raw: dict[str, Any]) -> list[str]:
    return [str(p) for p in validate(raw, policy=None)]


def settings(raw: dict[str, Any], pool: str) -> dict[str, str | None]:
    return {s.name: s.value for s in derive_pool(spec_of(raw), pool)}  # type: ignore[arg-type]


# ---- hardware profiles --------------------------------------------------------------------------


def test_every_shipped_profile_value_names_its_source() -> None:
    for profile in load_profiles().values():
        for env in profile.env:
            assert env.source.strip(), (profile.name, env.name)
        for field in ("batchPerRank", "memFractionStatic", "twoBatchOverlap"):
            assert field in profile.sources, (profile.name, field)


def test_the_profile_fills_what_the_spec_leaves_out_and_the_spec_wins() -> None:
    topo = spec_of(GB200).topology
    assert (topo.gpus_per_node, topo.gpu_memory, topo.nvlink_domain_size) == (4, "184Gi", 72)
    assert topo.node_selector == {"nvidia.com/gpu.product": "NVIDIA-GB200"}
    mine = spec_of(with_(GB200, "topology.nodeSelector", {"pool": "gb"})).topology
    assert mine.node_selector == {"pool": "gb"}
    assert spec_of(with_(H100, "topology.hostNetwork", True)).topology.host_network is True
    assert spec_of(H100).topology.host_network is False


def test_an_unknown_profile_is_refused_naming_the_known_ones() -> None:
    problems = refusals(with_(H100, "topology.hardware", "h300-ib"))
    assert problems and "unknown hardware profile 'h300-ib'" in problems[0] and "gb200-nvl72" in problems[0]


def test_a_platform_profile_file_adds_and_overrides(tmp_path: Path) -> None:
    shipped = load_profiles()["h200-roce"].model_dump(by_alias=True)
    shipped.update(name="h200-roce", rdmaResourceName="rdma/roce_a")
    extra = tmp_path / "profiles.yaml"
    extra.write_text(yaml.safe_dump({"profiles": [shipped, {**shipped, "name": "site-h200"}]}))
    profiles = load_profiles(str(extra))
    assert profiles["h200-roce"].rdma_resource_name == "rdma/roce_a"
    assert "site-h200" in profiles and "gb200-nvl72" in profiles
    extra.write_text("profiles: [{name: Bad Name}]\n")
    with pytest.raises(ValueError):
        load_profiles(str(extra))


# ---- derived settings ---------------------------------------------------------------------------


def test_h100_pools_get_the_reference_settings() -> None:
    prefill, decode = settings(H100, "prefill"), settings(H100, "decode")
    assert prefill["--moe-dense-tp-size"] == "1" and "--enable-dp-lm-head" in prefill
    assert prefill["--chunked-prefill-size"] == str(16384 * 32)
    assert prefill["--max-running-requests"] == str(256 * 32)
    assert "--enable-two-batch-overlap" in prefill and "--cuda-graph-max-bs-decode" not in prefill
    assert decode["--max-running-requests"] == str(256 * 72)
    assert decode["--cuda-graph-max-bs-decode"] == "256"
    assert decode["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "256"
    assert "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK" not in prefill  # normal kernels: no cap
    assert "--chunked-prefill-size" not in decode


def test_gb200_has_no_two_batch_overlap_and_moves_kv_over_nvlink() -> None:
    decode = settings(GB200, "decode")
    assert "--enable-two-batch-overlap" not in decode
    assert decode["--max-running-requests"] == str(768 * 48) and decode["--cuda-graph-max-bs-decode"] == "768"
    assert decode["NCCL_MNNVL_ENABLE"] == "1" and decode["SGLANG_MOONCAKE_CUSTOM_MEM_POOL"] == "NVLINK"


def test_roce_nic_mapping_only_for_low_latency_kernels() -> None:
    qwen = example("qwen3-235b-fp8-pd-h200-roce.yaml")
    assert "NVSHMEM_ENABLE_NIC_PE_MAPPING" in settings(qwen, "decode")
    assert "NVSHMEM_ENABLE_NIC_PE_MAPPING" not in settings(qwen, "prefill")  # DeepEP #336
    assert settings(qwen, "prefill")["NVSHMEM_IB_GID_INDEX"] == "3"


def test_without_a_profile_deepep_batches_stay_under_the_default_cap() -> None:
    """No hardware profile: no fabric settings, but a DeepEP pool still gets its running requests and
    graphs bounded by SGLang's default low-latency cap (128 tokens per rank)."""
    single = settings(example("qwen3-30b-a3b-single-node.yaml"), "decode")
    assert single["--max-running-requests"] == str(128 * 8) and single["--cuda-graph-max-bs-decode"] == "128"
    assert "--mem-fraction-static" not in single and "NCCL_SOCKET_IFNAME" not in single
    assert "--enable-two-batch-overlap" not in single
    tp_only = with_(H100, "decode.allToAllBackend", "none")
    assert "--enable-dp-lm-head" not in settings(tp_only, "decode")
    assert "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK" not in settings(tp_only, "decode")


def test_user_args_and_env_override_the_recipe_under_any_spelling() -> None:
    raw = with_(H100, "decode.extraArgs", ["--max-running-requests=9216", "--mem-fraction-static", "0.8"])
    raw = with_(raw, "engine.env", [{"name": "NCCL_SOCKET_IFNAME", "value": "ib0"}])
    spec = spec_of(raw)
    args = effective_args(spec, "decode")
    assert args.count("--mem-fraction-static") == 1 and "0.81" not in args
    assert not any(
        a.startswith("--max-running-requests") and a != "--max-running-requests=9216" for a in args
    )
    assert "NCCL_SOCKET_IFNAME" not in {e["name"] for e in effective_env(spec, "decode")}
    assert "--enable-dp-lm-head" in args  # the rest stays


def test_start_up_allowance() -> None:
    assert startup_timeout_s(spec_of(H100)) == 3600  # multi-node FP8 block model: DeepGEMM compiles
    assert startup_timeout_s(spec_of(example("qwen3-30b-a3b-single-node.yaml"))) == 1800
    assert startup_timeout_s(spec_of(with_(H100, "engine.startupTimeout", "45m"))) == 2700
    assert startup_timeout_s(spec_of(with_(H100, "engine.kernelCacheClaim", "kernels"))) == 2700  # warm


# ---- admission ----------------------------------------------------------------------------------


def test_the_examples_pass_and_warn_about_nothing() -> None:
    for name in ("deepseek-v3-pd-h100.yaml", "deepseek-v3-gb200.yaml", "qwen3-235b-fp8-pd-h200-roce.yaml"):
        raw = example(name)
        assert refusals(raw) == [], name
        assert warnings(raw) == [], name


def test_an_fp8_dense_split_is_refused_with_the_fix() -> None:
    problems = refusals(with_(H100, "prefill.extraArgs", ["--moe-dense-tp-size", "32"]))
    assert any("576 columns per GPU" in p and "--moe-dense-tp-size 1" in p for p in problems), problems
    assert refusals(with_(H100, "prefill.extraArgs", ["--moe-dense-tp-size", "1"])) == []


@pytest.mark.parametrize(
    ("extra", "env", "needle"),
    [
        (["--max-running-requests", "36864"], [], "512 per attention-DP rank = 512 tokens, above"),
        (["--cuda-graph-max-bs-decode", "512"], [], "captures decode batches of 512"),
        (
            ["--cuda-graph-bs-decode", "1", "2", "512"],
            [],
            "--cuda-graph-bs-decode captures decode batches of 512",
        ),
        (["--cuda-graph-config", '{"decode": {"max_bs": 1024}}'], [], "--cuda-graph-config captures"),
        (
            [],
            [{"name": "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "value": "2048"}],
            "asserts 1..1024",
        ),
        (
            [],
            [{"name": "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "value": "abc"}],
            "is not an integer",
        ),
        (["--max-running-requests", "0"], [], "nothing bounds the running requests"),
        (["--speculative-algorithm", "EAGLE"], [], "set --speculative-num-draft-tokens"),
        (
            ["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4"],
            [],
            "256 per attention-DP rank x 4 draft tokens = 1024 tokens",
        ),
    ],
)
def test_a_rank_busier_than_the_dispatch_cap_is_refused(
    extra: list[str], env: list[Any], needle: str
) -> None:
    raw = with_(with_(H100, "decode.extraArgs", extra), "engine.env", env)
    problems = refusals(raw)
    assert any(needle in p for p in problems), problems


def test_a_raised_cap_admits_a_bigger_batch_and_a_lowered_one_shrinks_the_batch() -> None:
    raw = with_(
        H100, "decode.extraArgs", ["--max-running-requests", "36864", "--cuda-graph-max-bs-decode", "512"]
    )
    raw = with_(
        raw, "engine.env", [{"name": "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "value": "512"}]
    )
    assert refusals(raw) == []
    low = with_(
        H100, "engine.env", [{"name": "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "value": "64"}]
    )
    assert refusals(low) == []
    decode = settings(low, "decode")
    assert decode["--max-running-requests"] == str(64 * 72) and decode["--cuda-graph-max-bs-decode"] == "64"


def test_a_cap_from_a_reference_is_not_guessed() -> None:
    ref = {
        "name": "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
        "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
    }
    raw = with_(H100, "engine.env", [ref])
    assert refusals(raw) == []
    assert any("comes from a reference" in w for w in warnings(raw))


def test_low_latency_kernels_never_carry_prefill_chunks() -> None:
    assert any(
        "cannot carry prefill" in p for p in refusals(with_(H100, "prefill.deepepMode", "low_latency"))
    )
    standalone = with_(example("qwen3-30b-a3b-single-node.yaml"), "decode.deepepMode", "low_latency")
    assert any("whole prefill chunks" in p for p in refusals(standalone))
    assert refusals(example("qwen3-30b-a3b-single-node.yaml")) == []  # auto: normal kernels for prefill


def test_only_one_or_the_whole_world_as_dense_tp() -> None:
    for value in ("8", "0", "-8"):
        problems = refusals(with_(H100, "decode.extraArgs", ["--moe-dense-tp-size", value]))
        assert any("takes only 1 or the instance's 72 GPUs" in p for p in problems), (value, problems)


def test_a_conflicting_user_flag_or_an_exclusion_removes_a_derived_switch() -> None:
    tp_lm = with_(H100, "decode.extraArgs", ["--enable-tp-lm-head-all-to-all"])
    assert "--enable-dp-lm-head" not in effective_args(spec_of(tp_lm), "decode")
    excluded = with_(H100, "engine.recipeExclude", ["--enable-two-batch-overlap", "NCCL_SOCKET_IFNAME"])
    spec = spec_of(excluded)
    assert "--enable-two-batch-overlap" not in effective_args(spec, "decode")
    assert "NCCL_SOCKET_IFNAME" not in {e["name"] for e in effective_env(spec, "decode")}
    assert "GLOO_SOCKET_IFNAME" in {e["name"] for e in effective_env(spec, "decode")}


def test_the_memory_check_sees_the_recipes_fraction() -> None:
    """What admission computes with is what the engine runs with: the same verdict whether the spec
    writes the recipe's fraction itself or not; and no fraction that is not one."""
    raw = with_(H100, "prefill.nodesPerReplica", 2)
    raw = with_(with_(raw, "decode.nodesPerReplica", 2), "decode.replicas", 1)
    raw = with_(raw, "eplb.redundantExperts", 80)
    written = with_(raw, "decode.extraArgs", ["--mem-fraction-static", "0.81"])
    assert [p.split(":")[0] for p in refusals(raw)] == [p.split(":")[0] for p in refusals(written)]
    for bad in ("nan", "inf", "0", "1.5"):
        problems = refusals(with_(H100, "decode.extraArgs", ["--mem-fraction-static", bad]))
        assert any("not a fraction of GPU memory" in p for p in problems), (bad, problems)


def test_normal_kernels_past_eight_nvlink_peers_without_rdma_are_refused() -> None:
    wide_prefill = with_(GB200, "prefill.nodesPerReplica", 4)
    problems = refusals(wide_prefill)
    assert any("at most 8 NVLink peers" in p and "at most 2 nodes (EP8)" in p for p in problems), problems
    assert refusals(with_(wide_prefill, "topology.rdmaResourceName", "rdma/ib")) == []
    standalone = copy.deepcopy(GB200)
    standalone.pop("prefill")
    assert any("set deepepMode: low_latency" in p for p in refusals(standalone))


def test_deepep_worlds_not_a_multiple_of_eight_are_refused() -> None:
    raw = with_(with_(H100, "topology.hardware", None), "topology.gpusPerNode", 4)
    raw = with_(raw, "decode.nodesPerReplica", 3)  # EP12
    raw = with_(raw, "eplb.redundantExperts", 8)  # 264 slots: divisible by 12
    raw.pop("prefill")
    assert any("not EP12" in p for p in refusals(raw)), refusals(raw)


def test_a_small_chunk_per_rank_warns() -> None:
    raw = with_(H100, "prefill.extraArgs", ["--chunked-prefill-size", "16384"])
    assert refusals(raw) == []
    assert any("512 tokens per rank" in w for w in warnings(raw))


def test_explain_names_every_setting_with_its_source() -> None:
    raw = with_(H100, "decode.extraArgs", ["--mem-fraction-static", "0.8"])
    text = explain(spec_of(raw))
    assert "[decode]" in text and "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256" in text
    assert "--mem-fraction-static=0.81  [overridden by the spec]" in text
    assert text.count("source:") == sum(len(derive_pool(spec_of(raw), p)) for p in ("prefill", "decode"))


def test_findings_never_escape_as_exceptions_on_odd_values() -> None:
    for extra in (
        ["--max-running-requests", "abc"],
        ["--moe-dense-tp-size", "0"],
        ["--chunked-prefill-size", "-1"],
    ):
        raw = with_(H100, "decode.extraArgs", extra)
        refusals(raw)  # may refuse (the flag rules), must not raise
        recipe_findings(spec_of(raw)) if not refusals(raw) else None


def test_a_kernel_cache_claim_keeps_compiled_kernels_per_image_gpu_and_node() -> None:
    from moe_operator.render.group import Owner, RuntimeSettings, pod_template
    from moe_operator.topology.planner import InstanceSite
    from moe_operator.validation import PlatformPolicy

    raw = with_(H100, "engine.kernelCacheClaim", "dsv3-kernels")
    spec = spec_of(raw)
    site = InstanceSite(
        "decode", 0, "rack", "topology.kubernetes.io/zone", "r0", tuple(f"n{i}" for i in range(9))
    )
    pod = pod_template(spec, Owner("ds", "ns", "u"), "decode", site, RuntimeSettings())
    engine = pod["containers"][0]
    names = [e["name"] for e in engine["env"]]
    cache = next(e["value"] for e in engine["env"] if e["name"] == "SGLANG_CACHE_DIR")
    assert names.index("KERNEL_CACHE_NODE") < names.index("SGLANG_CACHE_DIR"), (
        "expanded from an earlier variable"
    )
    assert (
        cache == "/var/cache/moe-kernels/lmsysorg_sglang_v0.5.23/NVIDIA-H100-80GB-HBM3/$(KERNEL_CACHE_NODE)"
    )
    assert {"name": "kernel-cache", "persistentVolumeClaim": {"claimName": "dsv3-kernels"}} in pod["volumes"]
    assert {"name": "kernel-cache", "mountPath": "/var/cache/moe-kernels"} in engine["volumeMounts"]
    no_claims = PlatformPolicy(model_volume_sources=("nfs",))
    assert any(p.field == "spec.engine.kernelCacheClaim" for p in validate(raw, policy=no_claims))
