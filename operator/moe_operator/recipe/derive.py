"""The rules: each reads a PoolContext and returns the settings it derives (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from moe_contract.flags import engine_catalog, resolve, router_catalog

from ..api import MoEDeploymentSpec
from ..api.derived import Pool
from .context import DISPATCH_CAP_ENV, PoolContext, pool_context
from .setting import Setting
from .startup import startup_timeout_s

DISPATCH_CAP_DEFAULT = 128
"""SGLang 0.5.23 srt/environ.py: the low-latency dispatch cap's default."""
DISPATCH_CAP_MAX = 1024
"""SGLang 0.5.23 srt/layers/moe/token_dispatcher/deepep.py asserts the cap is at most 1024."""
CHUNK_PER_RANK = 16384
"""Prefill tokens per attention-DP rank per chunk in every public wide-EP reference (sglang#6017:
524288 over 32 ranks; sglang#10903: 131072 over 8)."""

SGL = "sglang 0.5.23 "


def _arg(name: str, value: object, rule: str, source: str) -> Setting:
    return Setting("arg", name, None if value is None else str(value), rule, source)


def batch_per_rank(ctx: PoolContext) -> int:
    """Running requests one attention-DP rank holds: the profile's, else DeepEP's default cap; never
    more than a dispatch cap the spec sets itself (a low-latency rank must not exceed it)."""
    batch = ctx.profile.batch_per_rank if ctx.profile else DISPATCH_CAP_DEFAULT
    if isinstance(ctx.user_cap, int) and 0 < ctx.user_cap <= DISPATCH_CAP_MAX and ctx.low_latency:
        batch = min(batch, ctx.user_cap)
    return batch


def effective_deepep_mode(ctx: PoolContext) -> str:
    """auto in a P/D decode pool only ever runs decode batches: low_latency, said explicitly."""
    if ctx.role == "decode" and ctx.deepep_mode == "auto":
        return "low_latency"
    return ctx.deepep_mode


def dense_tp(ctx: PoolContext) -> list[Setting]:
    if not ctx.wide or ctx.arch is None or ctx.arch.dense_layers == 0:
        return []
    return [
        _arg(
            "--moe-dense-tp-size",
            1,
            "dense FFN layers run data-parallel instead of split over the whole EP world: a wide TP split "
            "leaves partial FP8 blocks (DeepSeek-V3 at TP32: 576 columns) and tiny GEMMs",
            SGL + "layers/quantization/fp8.py Fp8LinearMethod.validate_block_quant_shapes; "
            "layers/layer_boundary/layout.py is_dense_ffn_fully_dp; sglang#6017, sglang#10903",
        )
    ]


def dp_lm_head(ctx: PoolContext) -> list[Setting]:
    if not ctx.wide:
        return []
    return [
        _arg(
            "--enable-dp-lm-head",
            None,
            "the vocabulary projection stays per attention-DP rank (no all-gather over the EP world)",
            SGL
            + "arg_groups/overrides.py _dp_lm_head_validation (needs attention DP); sglang#6017, sglang#10903",
        )
    ]


def chunked_prefill(ctx: PoolContext) -> list[Setting]:
    # Only beside the profile's memory fraction: SGLang sizes its default fraction from the flag's
    # undivided value (arg_groups/memory_hook.py), which at 16384 x DP leaves nothing for weights.
    if ctx.role == "decode" or ctx.layout.attention_dp <= 1 or ctx.profile is None:
        return []
    return [
        _arg(
            "--chunked-prefill-size",
            CHUNK_PER_RANK * ctx.layout.attention_dp,
            f"the flag is divided among the {ctx.layout.attention_dp} attention-DP ranks: "
            f"{CHUNK_PER_RANK} tokens per rank",
            SGL + "arg_groups/parallel_hook.py handle_data_parallelism; sglang#6017, sglang#10903",
        )
    ]


def running_requests(ctx: PoolContext) -> list[Setting]:
    if not ctx.wide:
        return []
    b = batch_per_rank(ctx)
    return [
        _arg(
            "--max-running-requests",
            b * ctx.layout.attention_dp,
            f"{b} running requests per attention-DP rank (the flag is divided among the ranks), "
            "no more than the DeepEP dispatch cap and the CUDA graphs allow",
            SGL
            + "kv_cache_configurator.resolve_max_num_reqs; "
            + (ctx.profile.source("batchPerRank") if ctx.profile else "DeepEP dispatch cap default"),
        )
    ]


def cuda_graphs(ctx: PoolContext) -> list[Setting]:
    if not ctx.wide or ctx.role == "prefill" or effective_deepep_mode(ctx) == "normal":
        return []
    return [
        _arg(
            "--cuda-graph-max-bs-decode",
            batch_per_rank(ctx),
            "decode CUDA graphs cover every batch a rank may run (above the largest graph, decode runs "
            "eagerly)",
            SGL + "model_executor/cuda_graph_config.py (decode graphs; --cuda-graph-max-bs is ambiguous "
            "in 0.5.23); sglang#10903",
        )
    ]


def dispatch_cap(ctx: PoolContext) -> list[Setting]:
    if not ctx.low_latency or ctx.layout.ep_size <= 1 or ctx.role == "prefill":
        return []
    return [
        Setting(
            "env",
            DISPATCH_CAP_ENV,
            str(batch_per_rank(ctx)),
            "the low-latency kernels' buffer holds this many tokens per rank; a rank dispatching more "
            "fails DeepEP's host assertion. Set to the full per-rank batch, not half of it (two-batch "
            "overlap does not promise equal halves)",
            SGL + "environ.py (default 128), token_dispatcher/deepep.py (<= 1024); DeepEP "
            "low_latency_dispatch x.size(0) <= num_max_dispatch_tokens_per_rank; sglang#10903",
        )
    ]


def two_batch_overlap(ctx: PoolContext) -> list[Setting]:
    if not (ctx.profile and ctx.profile.two_batch_overlap and ctx.deepep and ctx.multi_node):
        return []
    return [
        _arg(
            "--enable-two-batch-overlap",
            None,
            "the all-to-all leaves NVLink here: overlap it with the other micro-batch's compute",
            ctx.profile.source("twoBatchOverlap"),
        )
    ]


def memory_fraction(ctx: PoolContext) -> list[Setting]:
    if not (ctx.profile and (ctx.wide or chunked_prefill(ctx))):
        return []
    return [
        _arg(
            "--mem-fraction-static",
            ctx.profile.mem_fraction_static[ctx.role],
            "SGLang's own default shrinks as attention DP grows (0.33-0.41 at DP32 on H200); the "
            "references set it explicitly",
            SGL + "arg_groups/memory_hook.py; " + ctx.profile.source("memFractionStatic"),
        )
    ]


def watchdog(ctx: PoolContext, startup_s: float) -> list[Setting]:
    if not (ctx.deepep and ctx.multi_node):
        return []
    return [
        _arg(
            "--watchdog-timeout",
            int(startup_s),
            "SGLang's watchdog (300 s) also times the first forward passes after graph capture; a cold "
            "wide-EP warm-up outlasts it. The operator's own start-up deadline bounds a hung start",
            SGL + "server_args watchdog_timeout; sglang#6017 sets 1000-1000000",
        )
    ]


def fabric_env(ctx: PoolContext) -> list[Setting]:
    if ctx.profile is None:
        return []
    mode = effective_deepep_mode(ctx)
    return [
        Setting("env", e.name, e.value, f"fabric of {ctx.profile.name}", e.source)
        for e in ctx.profile.env
        if not e.deepep_modes or (ctx.deepep and mode in e.deepep_modes)
    ]


def kv_env(ctx: PoolContext) -> list[Setting]:
    if not (ctx.profile and ctx.profile.fabric == "nvlink" and ctx.kv_backend == "mooncake"):
        return []
    source = "sglang#10903 scripts; " + SGL + "disaggregation/mooncake (custom memory pool NVLINK)"
    return [
        Setting(
            "env", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "NVLINK", "KV moves over multi-node NVLink", source
        ),
        Setting("env", "MC_FORCE_MNNVL", "1", "Mooncake's transfer engine uses multi-node NVLink", source),
    ]


KERNEL_CACHE_DIR = "/var/cache/moe-kernels"
"""Where spec.engine.kernelCacheClaim is mounted in engine pods."""
KERNEL_CACHE_NODE_ENV = "KERNEL_CACHE_NODE"
"""The node's name (downward API), set before the cache variables, which expand it: one directory per
node, so ranks on different nodes never write the same cache file."""


def kernel_cache_env(spec: MoEDeploymentSpec) -> list[Setting]:
    """The compiled-kernel caches on spec.engine.kernelCacheClaim, keyed by image and GPU type: one
    variable, from which SGLang derives DeepGEMM's, Triton's, TorchInductor's, CUDA's, TileLang's
    and FlashInfer's directories."""
    if not spec.engine.kernel_cache_claim:
        return []
    product = spec.topology.node_selector.get("nvidia.com/gpu.product", "gpu")
    image = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.engine.image)[-100:]
    return [
        Setting(
            "env",
            "SGLANG_CACHE_DIR",
            f"{KERNEL_CACHE_DIR}/{image}/{product}/$({KERNEL_CACHE_NODE_ENV})",
            "compiled kernels survive group restarts (spec.engine.kernelCacheClaim), per image, GPU type "
            "and node",
            SGL + "environ.py SGLANG_CACHE_DIR (SGLANG_DG_CACHE_DIR defaults under it) and "
            "third_party_cache_defaults (Triton, Inductor, CUDA, TileLang, FlashInfer, unless set)",
        )
    ]


Rule = Callable[[PoolContext], list[Setting]]
RULES: tuple[Rule, ...] = (
    dense_tp,
    dp_lm_head,
    chunked_prefill,
    running_requests,
    cuda_graphs,
    two_batch_overlap,
    memory_fraction,
    dispatch_cap,
    fabric_env,
    kv_env,
)


def derive_pool(spec: MoEDeploymentSpec, pool: Pool) -> list[Setting]:
    """Every setting the recipe derives for one pool, flags first (before any user override), less
    those spec.engine.recipeExclude leaves out."""
    ctx = pool_context(spec, pool)
    out = [s for rule in RULES for s in rule(ctx)]
    out += watchdog(ctx, startup_timeout_s(spec))
    out += kernel_cache_env(spec)
    excluded = set(spec.engine.recipe_exclude)
    return sorted((s for s in out if s.name not in excluded), key=lambda s: s.kind)


CONFLICTS: dict[str, frozenset[str]] = {
    "--enable-dp-lm-head": frozenset({"enable_tp_lm_head_all_to_all"}),
    "--enable-two-batch-overlap": frozenset({"enable_unified_memory"}),
}
"""Derived switches SGLang refuses beside a flag the user sets (its argparse dest): the user's flag
wins and the switch is left out. 0.5.23 arg_groups/overrides.py (DP LM head vs TP LM head
all-to-all), arg_groups/kv_cache_hook.py (unified memory vs two-batch overlap)."""


def user_args(spec: MoEDeploymentSpec, pool: Pool) -> list[str]:
    p = spec.prefill if pool == "prefill" and spec.prefill is not None else spec.decode
    return [*spec.engine.extra_args, *p.extra_args]


def kept(settings: Iterable[Setting], user: list[str], user_env: Iterable[str]) -> list[Setting]:
    """The derived settings the user does not override (a flag by its argparse dest, env by name)."""
    catalog = engine_catalog()
    overridden = {o.flag.dest for o in resolve(catalog, user).occurrences}
    names = set(user_env)
    return [
        s
        for s in settings
        if (
            s.kind == "arg"
            and catalog.flag(s.name).dest not in overridden
            and not CONFLICTS.get(s.name, frozenset()) & overridden
        )
        or (s.kind == "env" and s.name not in names)
    ]


def user_env_names(spec: MoEDeploymentSpec) -> list[str]:
    return [str(e.get("name")) for e in spec.engine.env if isinstance(e, Mapping)]


def effective_args(spec: MoEDeploymentSpec, pool: Pool) -> list[str]:
    """The engine arguments of a pool: derived ones the user does not set, then the user's."""
    user = user_args(spec, pool)
    derived = kept(derive_pool(spec, pool), user, user_env_names(spec))
    return [a for s in derived for a in s.argv()] + user


def effective_env(spec: MoEDeploymentSpec, pool: Pool) -> list[dict[str, Any]]:
    """Derived environment entries the user's spec.engine.env does not set (they go before it)."""
    derived = kept(derive_pool(spec, pool), [], user_env_names(spec))
    return [{"name": s.name, "value": s.value or ""} for s in derived if s.kind == "env"]


def kv_needs_one_domain(spec: MoEDeploymentSpec) -> bool:
    """P/D on a fabric where pods have no RDMA NIC (GB200 NVL72): the KV cache moves over multi-node
    NVLink only inside one domain, so prefill and decode instances are placed side by side there."""
    profile = pool_context(spec, "decode").profile
    return (
        spec.prefill is not None
        and profile is not None
        and profile.fabric == "nvlink"
        and not spec.topology.rdma_resource_name
    )


def router_policy(policy: str, workers: int) -> str:
    """sglang-router 0.3.2 refuses to start with power_of_two over fewer than 2 workers ("Power-of-two
    policy ... requires at least 2 ... workers"): one worker needs no choice, round_robin it is."""
    return "round_robin" if policy == "power_of_two" and workers < 2 else policy


def router_role_policies(spec: MoEDeploymentSpec, prefill: int, decode: int) -> list[str]:
    """In P/D the router picks a prefill instance by spec.router.policy and a decode instance by load:
    decode keeps no prefix cache (SGLang's P/D decode disables the radix cache), so cache affinity
    there only concentrates load. The user's router extraArgs win. ``prefill`` and ``decode``: the
    instances the router lists, not the spec's replicas: an autoscaled pool, or one with an instance
    off the list for its roll, may list one, where power_of_two stops the router at start-up."""
    if spec.prefill is None:
        return []
    user = {o.flag.dest for o in resolve(router_catalog(), list(spec.router.extra_args)).occurrences}
    out: list[str] = []
    if "prefill_policy" not in user:
        out += ["--prefill-policy", router_policy(spec.router.policy, prefill)]
    if "decode_policy" not in user:
        out += ["--decode-policy", router_policy("power_of_two", decode)]
    return out
