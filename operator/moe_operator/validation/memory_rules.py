"""Rule: each instance's weights plus a minimal KV cache fit its GPUs' memory."""

from __future__ import annotations

import math
from dataclasses import replace

from ..api.derived import (
    bytes_per_param,
    kv_bytes_per_element,
    pool_layout,
    pools,
    resolve_architecture,
    weight_dtype,
)
from ..api.spec import MoEDeploymentSpec, PoolSpec
from ..api.types import parse_bytes
from ..capacity.layout import InstanceLayout
from ..capacity.memory import (
    DEFAULT_MIN_KV_TOKENS,
    DEFAULT_USABLE_FRACTION,
    max_concurrent_tokens,
    memory_fit,
    smallest_fitting_nodes,
)
from ..models.architecture import MoEArchitecture
from ..recipe import effective_args
from .common import gib
from .flags import CONTEXT_LENGTH_FLAG, MEM_FRACTION_FLAG, flag_value
from .problem import Problem


def check_gpu_memory(spec: MoEDeploymentSpec) -> list[Problem]:
    """gpuMemory must be a positive amount of bytes."""
    try:
        if parse_bytes(spec.topology.gpu_memory) > 0:
            return []
    except ValueError:
        pass
    return [
        Problem(
            "spec.topology.gpuMemory",
            f"spec.topology.gpuMemory ({spec.topology.gpu_memory}) must be a positive quantity of bytes per "
            "GPU; "
            "set it to the GPU's memory, such as 80Gi",
        )
    ]


def check_memory(spec: MoEDeploymentSpec) -> list[Problem]:
    """Weights + KV for one request of --context-length (else 4096 tokens) fit every GPU of each pool."""
    arch = resolve_architecture(spec.model)
    if arch is None or check_gpu_memory(spec):
        return []
    problems: list[Problem] = []
    for name, pool in pools(spec).items():
        try:
            layout = pool_layout(pool, spec.topology)
        except ValueError:
            continue  # reported by the attention rule
        problem = _check_pool(spec, arch, name, pool, layout)
        if problem is not None:
            problems.append(problem)
    return problems


def _check_pool(
    spec: MoEDeploymentSpec, arch: MoEArchitecture, name: str, pool: PoolSpec, layout: InstanceLayout
) -> Problem | None:
    # What the engine runs with: the recipe's settings, then the user's (recipe.effective_args).
    args = effective_args(spec, name)  # type: ignore[arg-type]
    fraction = _number(flag_value(args, MEM_FRACTION_FLAG), DEFAULT_USABLE_FRACTION)
    if not 0 < fraction <= 1:
        return Problem(
            f"spec.{name}.extraArgs",
            f"spec.{name}: --mem-fraction-static {flag_value(args, MEM_FRACTION_FLAG)} is not a fraction of "
            "GPU memory: give a number above 0 and at most 1",
        )
    min_tokens = int(_number(flag_value(args, CONTEXT_LENGTH_FLAG), DEFAULT_MIN_KV_TOKENS))
    gpu_bytes = parse_bytes(spec.topology.gpu_memory)
    b_param, b_kv = bytes_per_param(spec.model, arch), kv_bytes_per_element(spec.model)
    redundant = spec.eplb.redundant_experts if layout.ep_size > 1 else 0
    fit = memory_fit(arch, layout, gpu_bytes, b_param, b_kv, redundant, fraction, min_tokens)
    if fit.fits:
        return None
    nodes = smallest_fitting_nodes(arch, layout, gpu_bytes, b_param, b_kv, redundant, fraction, min_tokens)
    field = f"spec.{name}.nodesPerReplica"
    head = (
        f"{field}: one instance of spec.{name} ({layout.nodes} node(s) x {layout.gpus_per_node} GPUs, EP "
        f"{layout.ep_size}, attention TP {layout.attention_tp}) needs {gib(fit.weights.total)} of "
        f"{weight_dtype(spec.model, arch)} weights per GPU ({gib(fit.weights.experts)} for "
        f"{fit.weights.expert_slots_per_gpu:g} expert slots x {arch.moe_layers} MoE layers, "
        f"{gib(fit.weights.dense)} dense) plus {gib(fit.min_kv_bytes)} of KV cache for {min_tokens} tokens, "
        f"but only {gib(fit.usable_bytes)} of each GPU is usable (gpuMemory {spec.topology.gpu_memory} x "
        f"{fraction:g})"
    )
    if nodes is None:
        return Problem(
            field,
            f"{head}; no instance of up to 128 nodes fits: use GPUs with more memory "
            "(spec.topology.gpuMemory), a smaller spec.model.dtype, spec.model.kvCacheDtype fp8_e4m3 "
            "or a shorter --context-length",
        )
    even = _divisible_nodes(arch, layout, nodes, redundant)
    if even is not None and even != nodes:
        return Problem(
            field,
            f"{head}; set {field} to at least {nodes} ({even} is the smallest that fits and also divides the "
            f"{arch.routed_experts + redundant} expert slots evenly)",
        )
    return Problem(field, f"{head}; set {field} to at least {nodes}, the smallest that fits")


def _divisible_nodes(arch: MoEArchitecture, layout: InstanceLayout, start: int, redundant: int) -> int | None:
    """First node count from ``start`` whose EP size also divides the expert slots."""
    if layout.ep_size <= 1:
        return start
    for nodes in range(start, 129):
        if nodes * layout.gpus_per_node % layout.attention_tp:
            continue
        candidate = replace(
            layout, nodes=nodes, attention_dp=nodes * layout.gpus_per_node // layout.attention_tp
        )
        if (arch.routed_experts + redundant) % candidate.ep_size == 0:
            return nodes
    return None


def _number(value: str | None, default: float) -> float:
    """The flag's number; nan and inf come back as -1 (no fraction, no token count)."""
    try:
        number = float(value) if value is not None else default
    except ValueError:
        return default
    return number if math.isfinite(number) else -1.0


def kv_tokens_at_width(spec: MoEDeploymentSpec, name: str, nodes: int) -> int:
    """KV tokens one instance of pool ``name`` would hold at ``nodes`` nodes, with the same
    attention TP and the pool's engine settings; 0 where that width does not fit or does not
    divide the expert slots. Wider EP holds fewer expert weights per GPU, so more KV."""
    arch = resolve_architecture(spec.model)
    pool = pools(spec).get(name)  # type: ignore[call-overload]
    if arch is None or pool is None:
        return 0
    try:
        layout = pool_layout(pool, spec.topology)
    except ValueError:
        return 0
    world = nodes * layout.gpus_per_node
    if world % layout.attention_tp:
        return 0
    at = replace(layout, nodes=nodes, attention_dp=world // layout.attention_tp)
    redundant = spec.eplb.redundant_experts if at.ep_size > 1 else 0
    if at.ep_size > 1 and (arch.routed_experts + redundant) % at.ep_size:
        return 0
    args = effective_args(spec, name)  # type: ignore[arg-type]
    fraction = _number(flag_value(args, MEM_FRACTION_FLAG), DEFAULT_USABLE_FRACTION)
    if not 0 < fraction <= 1:
        return 0
    gpu_bytes = parse_bytes(spec.topology.gpu_memory)
    b_param, b_kv = bytes_per_param(spec.model, arch), kv_bytes_per_element(spec.model)
    fit = memory_fit(arch, at, gpu_bytes, b_param, b_kv, redundant, fraction)
    return max_concurrent_tokens(fit, at) if fit.fits else 0
