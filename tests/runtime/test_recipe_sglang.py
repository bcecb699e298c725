"""SGLang 0.5.23's own argument resolution and checks pass on every rendered engine command.

Beyond the parser (test_rendered_examples.py): for every example, and for the same specs with
every user extraArgs and env removed, each pool's rank-0 command (as `moe-runtime print-args`
builds it from the rendered ConfigMap and pod environment) goes through SGLang's
prepare_server_args, ServerArgs.resolve_once and check_server_args in a process of its own
(sglang_resolve.py: only the GPU facts are stubbed), with the model's config.json stood in from
the operator's catalog. Then the resolved values must agree with what the recipe promised: the
dense FFN keeps whole FP8 blocks (SGLang's Fp8LinearMethod check), no rank can run more requests
than DeepEP's low-latency cap, decode CUDA graphs stay under the cap, chunked prefill is 16384
tokens per DP rank. A spec with the recipe's dense-TP flag taken away fails the same check.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from rt_helpers import REPO, require_sglang
from test_rendered_examples import engine_config, pod_env, pod_templates, print_args

pytestmark = pytest.mark.runtime

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
DRIVER = Path(__file__).with_name("sglang_resolve.py")
GPUS = {  # nvidia-smi's memory.total (MiB) and compute capability of each profile's GPU
    "NVIDIA-H100-80GB-HBM3": (90, 81559),
    "NVIDIA-H200": (90, 143771),
    "NVIDIA-B200": (100, 183359),
    "NVIDIA-GB200": (100, 189471),
}
CAP_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"

# Published config.json fields the operator's catalog does not carry (DeepSeek-V3's and Qwen3's
# model cards); the rest comes from the catalog, so a catalog error shows here.
_DEEPSEEK_EXTRA = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "moe_layer_freq": 1, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}  # fmt: skip
_QWEN3_EXTRA = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
    "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "mlp_only_layers": [],
}  # fmt: skip


def _config_json(model_name: str) -> dict[str, Any]:
    from moe_operator.models.catalog import lookup

    arch = lookup(model_name)
    assert arch is not None, model_name
    cfg: dict[str, Any] = {
        "hidden_size": arch.hidden_size, "num_hidden_layers": arch.layers,
        "intermediate_size": arch.intermediate_size, "moe_intermediate_size": arch.moe_intermediate_size,
        "num_attention_heads": arch.attention.num_heads, "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_context, "num_experts_per_tok": arch.experts_per_token,
    }  # fmt: skip
    if arch.attention.kind == "MLA":
        cfg.update(_DEEPSEEK_EXTRA)
        cfg.update({
            "n_routed_experts": arch.routed_experts, "n_shared_experts": arch.shared_experts,
            "n_group": arch.expert_groups, "topk_group": arch.topk_groups,
            "first_k_dense_replace": arch.dense_layers, "kv_lora_rank": arch.attention.kv_lora_rank,
            "qk_rope_head_dim": arch.attention.qk_rope_head_dim, "num_key_value_heads": arch.attention.num_heads,
        })  # fmt: skip
    else:
        cfg.update(_QWEN3_EXTRA)
        cfg.update({
            "num_experts": arch.routed_experts, "num_key_value_heads": arch.attention.kv_heads,
            "head_dim": arch.attention.head_dim,
        })  # fmt: skip
    if arch.fp8_block is not None:
        cfg["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(arch.fp8_block),
        }  # fmt: skip
    return cfg


@cache
def _model_dir(model_name: str, root: str) -> str:
    path = Path(root) / model_name.replace("/", "__")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(_config_json(model_name)))
    return str(path)


def _render(doc: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    spec_file = tmp / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "moe_operator.cli", "render", "-f", str(spec_file),
         "--policy", str(REPO / "policies" / "platform" / "examples.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _without_user_settings(doc: dict[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(doc)
    spec = bare["spec"]
    for section in ("engine", "prefill", "decode", "router"):
        if isinstance(spec.get(section), dict):
            spec[section].pop("extraArgs", None)
    spec.get("engine", {}).pop("env", None)
    return bare


def _resolve(argv: list[str], env: dict[str, str], gpu: tuple[int, int], dense: Any) -> dict[str, Any]:
    request = {"argv": argv, "env": env, "gpu": {"sm": gpu[0], "memMiB": gpu[1]}, "denseFfn": dense}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "NCCL_", "NVSHMEM_"))}
    res = subprocess.run(
        [sys.executable, str(DRIVER)], input=json.dumps(request), capture_output=True, text=True,
        timeout=300, check=False, env=clean,
    )  # fmt: skip
    assert res.returncode == 0, f"SGLang 0.5.23 refuses {argv}: {res.stderr[-2000:]}"
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _check_pools(doc: dict[str, Any], tmp: Path) -> dict[str, dict[str, Any]]:
    """Resolve each pool's rank-0 command; return the resolved fields per pool."""
    from moe_operator.models.catalog import lookup

    objects = _render(doc, tmp)
    spec = doc["spec"]
    arch = lookup(spec["model"]["name"])
    assert arch is not None
    dense = (
        {"hidden": arch.hidden_size, "intermediate": arch.intermediate_size, "block": arch.fp8_block[0]}
        if arch.fp8_block and arch.dense_layers
        else None
    )
    out: dict[str, dict[str, Any]] = {}
    for group, template, _ in pod_templates(objects):
        pool = template["metadata"]["labels"]["moe.inference.dev/pool"]
        if pool in out:
            continue
        config = engine_config(objects, template)
        env = pod_env(template, group, 0)
        argv = print_args(config, env, tmp / group)[3:]
        model = _model_dir(spec["model"]["name"], str(tmp / "models"))
        argv[argv.index("--model-path") + 1] = model
        product = template["spec"].get("nodeSelector", {}).get("nvidia.com/gpu.product", "")
        resolved = _resolve(argv, env, GPUS.get(product, GPUS["NVIDIA-H100-80GB-HBM3"]), dense)
        _agree(config, env, resolved, pool)
        out[pool] = resolved
    return out


def _agree(config: dict[str, Any], env: dict[str, str], r: dict[str, Any], pool: str) -> None:
    par = config["parallel"]
    world, dp = par["nnodes"] * par["gpusPerNode"], par["attnDp"]
    where = f"{pool}: "
    assert r["tp_size"] == world, where
    # SGLang sizes its default fraction from the flags; a negative one means no room for the weights
    assert 0 < r["mem_fraction_static"] < 1, where + f"mem_fraction_static {r['mem_fraction_static']}"
    assert r.get("dense_fp8_error") is None, where + str(r.get("dense_fp8_error"))
    if par.get("a2aBackend") != "deepep" or world <= 1 or dp <= 1:
        return
    assert r["ep_size"] == world and r["moe_a2a_backend"] == "deepep", where
    assert r["enable_dp_lm_head"] is True, where
    cap = int(env.get(CAP_ENV, "128"))
    assert cap <= 1024, where
    # Resolved max_running_requests is the instance's (each DP rank takes its share, kv_cache_configurator);
    # resolved chunked_prefill_size is already one rank's (parallel_hook divides it).
    if r["deepep_mode"] != "normal" and pool != "prefill":
        per_rank = r["max_running_requests"] // dp
        assert per_rank <= cap, where + f"{per_rank} running requests per rank > dispatch cap {cap}"
        assert r["cuda_graph_decode_max_bs"] <= cap, where + "decode CUDA graphs above the dispatch cap"
        assert r["cuda_graph_decode_backend"] != "disabled", where + "decode runs without CUDA graphs"
    if pool == "prefill":
        assert r["chunked_prefill_size"] == 16384, where + f"{r['chunked_prefill_size']} tokens per DP rank"


@pytest.mark.parametrize("bare", [False, True], ids=["as-written", "no-user-settings"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_sglang_resolves_and_checks_every_pool(example: Path, bare: bool, tmp_path: Path) -> None:
    require_sglang()
    pytest.importorskip("transformers")  # installed by runtime/scripts/setup-test-env.sh
    doc = yaml.safe_load(example.read_text())
    _check_pools(_without_user_settings(doc) if bare else doc, tmp_path)


def test_without_the_dense_tp_flag_sglang_refuses_the_fp8_split(tmp_path: Path) -> None:
    """The check can fail: the H100 prefill pool (TP32) with --moe-dense-tp-size set back to the
    whole world fails SGLang's own FP8 block check, and admission refuses it first."""
    require_sglang()
    from moe_operator.validation import validate

    doc = yaml.safe_load((REPO / "examples" / "deepseek-v3-pd-h100.yaml").read_text())
    doc["spec"]["prefill"]["extraArgs"] = ["--moe-dense-tp-size", "32"]
    problems = [str(p) for p in validate(doc["spec"], policy=None)]
    assert any("576 columns per GPU" in p and "--moe-dense-tp-size 1" in p for p in problems), problems
    from moe_operator.models.catalog import lookup

    arch = lookup("deepseek-ai/DeepSeek-V3")
    assert arch is not None
    r = _resolve(
        ["--model-path", _model_dir("deepseek-ai/DeepSeek-V3", str(tmp_path)), "--tp-size", "32",
         "--attn-dp-size", "32", "--moe-a2a-backend", "deepep", "--moe-dense-tp-size", "32"],
        {}, GPUS["NVIDIA-H100-80GB-HBM3"], {"hidden": arch.hidden_size, "intermediate": 18432, "block": 128},
    )  # fmt: skip
    assert r["dense_fp8_error"] == (
        "Weight output_partition_size = 576 is not divisible by weight quantization block_n = 128."
    )
