"""The recipe's rules held against what a pool ends up with (derived settings plus the user's):
refusals for what cannot start, warnings for what loses throughput, each with the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from moe_contract.flags import engine_catalog, resolve

from ..api import MoEDeploymentSpec
from ..api.derived import Pool, pools
from .context import PoolContext, pool_context
from .derive import (
    CHUNK_PER_RANK,
    DISPATCH_CAP_DEFAULT,
    DISPATCH_CAP_ENV,
    DISPATCH_CAP_MAX,
    effective_args,
    effective_deepep_mode,
    effective_env,
)

NVL_PEERS = 8
"""DeepEP's legacy Buffer: num_ranks < 8 or num_ranks % 8 == 0 (csrc/legacy/buffer.hpp), every mode."""


@dataclass(frozen=True)
class Finding:
    severity: Literal["refuse", "warn"]
    field: str
    message: str


def _last(args: list[str], dest: str) -> str | None:
    occ = resolve(engine_catalog(), args).last(dest)
    if occ is None:
        return None
    value = occ.value
    if isinstance(value, list):
        value = value[-1] if value else None
    return None if value is None else str(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _env_value(spec: MoEDeploymentSpec, pool: Pool, name: str) -> str | None:
    """The value the engine sees for ``name`` (the last entry wins, as in a pod's env list)."""
    found: str | None = None
    for entry in [*effective_env(spec, pool), *spec.engine.env]:
        if entry.get("name") == name and "value" in entry:
            found = str(entry["value"])
    return found


def pool_findings(spec: MoEDeploymentSpec, pool: Pool) -> list[Finding]:
    ctx = pool_context(spec, pool)
    args = effective_args(spec, pool)
    where = f"spec.{pool}"
    out: list[Finding] = []
    out += _dense_split(ctx, args, where)
    out += _deepep_world(ctx, where)
    out += _normal_kernels(ctx, where)
    out += _dispatch_cap(spec, ctx, args, where)
    out += _chunk(ctx, args, where)
    return out


def _dense_split(ctx: PoolContext, args: list[str], where: str) -> list[Finding]:
    arch = ctx.arch
    if arch is None or not ctx.fp8:
        return []
    dense_tp = _int(_last(args, "moe_dense_tp_size")) or ctx.layout.world
    if arch.dense_tp_fits(dense_tp):
        return []
    shard = arch.intermediate_size / dense_tp
    return [
        Finding(
            "refuse",
            f"{where}.extraArgs",
            f"{where}: the dense FFN ({arch.intermediate_size} wide) split over {dense_tp} GPUs leaves "
            f"{shard:g} columns per GPU, not a multiple of the FP8 block {arch.fp8_block}: SGLang refuses "
            "it at weight load (layers/quantization/fp8.py validate_block_quant_shapes). Run the dense "
            "layers data-parallel (--moe-dense-tp-size 1, with attentionDataParallel = the instance's "
            "GPUs), or remove the --moe-dense-tp-size override",
        )
    ]


def _deepep_world(ctx: PoolContext, where: str) -> list[Finding]:
    ep = ctx.layout.ep_size
    if not ctx.deepep or ep < NVL_PEERS or ep % NVL_PEERS == 0:
        return []
    return [
        Finding(
            "refuse",
            f"{where}.nodesPerReplica",
            f"{where}: DeepEP runs on fewer than 8 ranks or a multiple of 8, not EP{ep} (DeepEP "
            "csrc/legacy/buffer.hpp Buffer); choose nodesPerReplica so nodes x gpusPerNode is a multiple of 8",
        )
    ]


def _normal_kernels(ctx: PoolContext, where: str) -> list[Finding]:
    limit = ctx.profile.deepep_normal_max_ep if ctx.profile else None
    mode = effective_deepep_mode(ctx)
    # With RDMA NICs the normal kernels reach peers beyond the NVLink group over IBGDA.
    if not ctx.deepep or limit is None or ctx.rdma or ctx.layout.ep_size <= limit or mode == "low_latency":
        return []
    assert ctx.profile is not None
    nodes = max(limit // ctx.layout.gpus_per_node, 1)
    fix = (
        f"give each prefill instance at most {nodes} nodes (EP{limit}) and add replicas instead"
        if ctx.role == "prefill"
        else "set deepepMode: low_latency"
    )
    return [
        Finding(
            "refuse",
            f"{where}.deepepMode",
            f"{where}: DeepEP's normal kernels (deepepMode {mode}) map at most {limit} NVLink peers "
            f"on {ctx.profile.name}, not EP{ctx.layout.ep_size}, and the pods have no RDMA NIC for the "
            f"rest (DeepEP legacy Buffer; DeepEP issues 392 and 579): {fix}, or set "
            "spec.topology.rdmaResourceName",
        )
    ]


def _dispatch_cap(spec: MoEDeploymentSpec, ctx: PoolContext, args: list[str], where: str) -> list[Finding]:
    if not ctx.low_latency or ctx.layout.ep_size <= 1 or ctx.role == "prefill":
        return []
    cap = _int(_env_value(spec, ctx.pool, DISPATCH_CAP_ENV)) or DISPATCH_CAP_DEFAULT
    if cap > DISPATCH_CAP_MAX:
        return [
            Finding(
                "refuse",
                "spec.engine.env",
                f"{DISPATCH_CAP_ENV}={cap}: SGLang asserts at most {DISPATCH_CAP_MAX} "
                "(token_dispatcher/deepep.py); lower it and --max-running-requests with it",
            )
        ]
    out: list[Finding] = []
    dp = ctx.layout.attention_dp
    mrr = _int(_last(args, "max_running_requests"))
    if mrr is None:
        out.append(
            Finding(
                "refuse",
                f"{where}.extraArgs",
                f"{where}: nothing bounds the running requests of a rank under DeepEP's low-latency cap "
                f"({cap} tokens per rank): set --max-running-requests to at most {cap * dp} "
                f"({cap} per attention-DP rank x {dp})",
            )
        )
    elif mrr // dp > cap:
        out.append(
            Finding(
                "refuse",
                f"{where}.extraArgs",
                f"{where}: --max-running-requests {mrr} is {mrr // dp} per attention-DP rank, above "
                f"DeepEP's low-latency dispatch cap {DISPATCH_CAP_ENV}={cap}: a full rank fails DeepEP's "
                f"assertion. Lower it to {cap * dp} or raise the cap (at most {DISPATCH_CAP_MAX})",
            )
        )
    graph = _int(_last(args, "cuda_graph_max_bs_decode"))
    if graph is not None and graph > cap:
        out.append(
            Finding(
                "refuse",
                f"{where}.extraArgs",
                f"{where}: --cuda-graph-max-bs-decode {graph} captures batches above DeepEP's "
                f"low-latency dispatch cap {cap}: capture fails. Lower it to {cap} or raise the cap",
            )
        )
    return out


def _chunk(ctx: PoolContext, args: list[str], where: str) -> list[Finding]:
    dp = ctx.layout.attention_dp
    chunk = _int(_last(args, "chunked_prefill_size"))
    if ctx.role == "decode" or dp <= 1 or chunk is None or chunk <= 0 or chunk // dp >= CHUNK_PER_RANK // 4:
        return []
    return [
        Finding(
            "warn",
            f"{where}.extraArgs",
            f"{where}: --chunked-prefill-size {chunk} is divided among {dp} attention-DP ranks: "
            f"{chunk // dp} tokens per rank (the references use {CHUNK_PER_RANK}); remove the override "
            f"or set {CHUNK_PER_RANK * dp}",
        )
    ]


def deployment_findings(spec: MoEDeploymentSpec) -> list[Finding]:
    """Findings that span pools: where the KV cache travels between prefill and decode."""
    profile = pool_context(spec, "decode").profile
    out: list[Finding] = []
    if (
        spec.prefill is None
        or profile is None
        or profile.rdma_resource_name
        or spec.topology.rdma_resource_name
    ):
        return out
    gpus = sum(p.replicas * p.nodes_per_replica * spec.topology.gpus_per_node for p in pools(spec).values())
    domain = spec.topology.nvlink_domain_size or spec.topology.gpus_per_node
    if gpus > domain:
        out.append(
            Finding(
                "warn",
                "spec.topology.rdmaResourceName",
                f"prefill and decode take {gpus} GPUs, more than one NVLink domain ({domain}), and the pods "
                "have no RDMA NIC: KV caches between domains move over TCP. Fit both pools in one domain or "
                "set rdmaResourceName",
            )
        )
    return out


def recipe_findings(spec: MoEDeploymentSpec) -> list[Finding]:
    out = [f for pool in pools(spec) for f in pool_findings(spec, pool)]
    return out + deployment_findings(spec)
