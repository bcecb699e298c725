"""The recipe's rules held against what a pool ends up with (derived settings plus the user's):
refusals for what cannot start, warnings for what loses throughput, each with the fix."""

from __future__ import annotations

from ..api import MoEDeploymentSpec
from ..api.derived import Pool, pools
from .cap_checks import cap_findings
from .context import PoolContext, pool_context
from .derive import (
    CHUNK_PER_RANK,
    effective_args,
    effective_deepep_mode,
)
from .findings import Finding, as_int, last_value

NVL_PEERS = 8
"""DeepEP's legacy Buffer: num_ranks < 8 or num_ranks % 8 == 0 (csrc/legacy/buffer.hpp), every mode."""


def pool_findings(spec: MoEDeploymentSpec, pool: Pool) -> list[Finding]:
    ctx = pool_context(spec, pool)
    args = effective_args(spec, pool)
    where = f"spec.{pool}"
    out: list[Finding] = []
    out += _dense_split(ctx, args, where)
    out += _deepep_world(ctx, where)
    out += _normal_kernels(ctx, where)
    out += cap_findings(ctx, args, where)
    out += _chunk(ctx, args, where)
    return out


def _dense_split(ctx: PoolContext, args: list[str], where: str) -> list[Finding]:
    written = last_value(args, "moe_dense_tp_size")
    dense_tp = as_int(written) if written is not None else ctx.layout.world
    if dense_tp not in (1, ctx.layout.world):
        return [
            Finding(
                "refuse",
                f"{where}.extraArgs",
                f"{where}: --moe-dense-tp-size {written}: SGLang takes only 1 or the instance's "
                f"{ctx.layout.world} GPUs (arg_groups/validation_hook.py check_server_args); use 1",
            )
        ]
    arch = ctx.arch
    if arch is None or not ctx.fp8 or dense_tp is None:
        return []
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


def _chunk(ctx: PoolContext, args: list[str], where: str) -> list[Finding]:
    dp = ctx.layout.attention_dp
    chunk = as_int(last_value(args, "chunked_prefill_size"))
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
