"""Rules about each pool's parallel layout: attention TP/DP, all-to-all backend, expert slots."""

from __future__ import annotations

import math

from ..api.derived import (
    attention_dp,
    nvlink_domain_size,
    pool_layout,
    pools,
    resolve_architecture,
    world_size,
)
from ..api.spec import MoEDeploymentSpec, PoolSpec
from .problem import Problem

DEEPEP_INTRANODE_RANKS = (2, 4, 8)


def check_topology(spec: MoEDeploymentSpec) -> list[Problem]:
    """An NVLink domain is a whole number of nodes."""
    topo = spec.topology
    problems: list[Problem] = []
    size = topo.nvlink_domain_size
    if size is None or size % topo.gpus_per_node == 0:
        return problems
    return [
        *problems,
        Problem(
            "spec.topology.nvlinkDomainSize",
            f"spec.topology.nvlinkDomainSize ({size}) must be a multiple of spec.topology.gpusPerNode "
            f"({topo.gpus_per_node}): a domain is a whole number of nodes; set it to the GPUs of one "
            "domain, such as 72 for GB200 NVL72 (18 trays x 4)",
        ),
    ]


def check_attention(spec: MoEDeploymentSpec) -> list[Problem]:
    """attentionDataParallel divides the world; attention TP stays inside one NVLink domain."""
    problems: list[Problem] = []
    topo = spec.topology
    domain = nvlink_domain_size(topo)
    for name, pool in pools(spec).items():
        world = world_size(pool, topo)
        field = f"spec.{name}.attentionDataParallel"
        dp = attention_dp(pool, topo)
        if world % dp:
            divisors = [d for d in range(1, world + 1) if world % d == 0 and world // d <= domain]
            problems.append(
                Problem(
                    field,
                    f"{field} ({dp}) must divide the instance's GPU world of {world} "
                    f"(spec.{name}.nodesPerReplica {pool.nodes_per_replica} x gpusPerNode "
                    f"{topo.gpus_per_node}); "
                    f"use one of {_short(divisors)}",
                )
            )
            continue
        tp = world // dp
        if tp > domain:
            smallest = math.ceil(world / domain)
            while world % smallest:
                smallest += 1
            problems.append(
                Problem(
                    field,
                    f"attention tensor parallelism of spec.{name} is {tp} GPUs (world {world} / "
                    f"attentionDataParallel {dp}) but one NVLink domain holds {domain} "
                    f"(spec.topology.nvlinkDomainSize, else gpusPerNode); TP across domains crawls over the "
                    f"network: set {field} to at least {smallest}",
                )
            )
    return problems


def check_backend(spec: MoEDeploymentSpec) -> list[Problem]:
    """DeepEP needs a world of at least 2 GPUs, and 2, 4 or 8 inside a single node."""
    problems: list[Problem] = []
    topo = spec.topology
    for name, pool in pools(spec).items():
        if pool.all_to_all_backend != "deepep":
            continue
        field = f"spec.{name}.allToAllBackend"
        world = world_size(pool, topo)
        if world == 1:
            problems.append(
                Problem(
                    field,
                    f"{field} is deepep but an instance of spec.{name} has a single GPU, with nobody to "
                    "exchange tokens with; set it to none (or give the instance more GPUs)",
                )
            )
        elif pool.nodes_per_replica == 1 and world not in DEEPEP_INTRANODE_RANKS:
            problems.append(
                Problem(
                    field,
                    f"{field} is deepep but a single-node instance of spec.{name} has {world} GPUs; DeepEP's "
                    f"intranode kernels support {', '.join(map(str, DEEPEP_INTRANODE_RANKS))} ranks: set "
                    "gpusPerNode accordingly or use allToAllBackend none",
                )
            )
    return problems


def check_expert_slots(spec: MoEDeploymentSpec) -> list[Problem]:
    """Experts + redundant slots divide every pool's EP size; redundancy needs EP > 1."""
    arch = resolve_architecture(spec.model)
    topo = spec.topology
    redundant = spec.eplb.redundant_experts
    field = "spec.eplb.redundantExperts"
    problems: list[Problem] = []
    ep_pools: list[tuple[str, PoolSpec, int]] = []
    for pool_name, pool_spec in pools(spec).items():
        size = _ep(pool_spec, spec)
        if size is not None:  # None: attentionDataParallel does not divide the world (reported elsewhere)
            ep_pools.append((pool_name, pool_spec, size))
    if redundant and all(ep == 1 for _, _, ep in ep_pools):
        problems.append(
            Problem(
                field,
                f"{field} is {redundant} but no pool has expert parallelism (EP size 1: a single GPU or "
                "allToAllBackend none), so there is nowhere to put copies; set it to 0",
            )
        )
        return problems
    if arch is None:
        return problems
    experts = arch.routed_experts
    if redundant > experts:
        problems.append(
            Problem(
                field,
                f"{field} ({redundant}) exceeds the model's {experts} routed experts; more copies than "
                f"experts only waste memory: use at most {experts}",
            )
        )
        return problems
    sizes = [ep for _, _, ep in ep_pools if ep > 1]
    if not sizes:
        return problems
    step = math.lcm(*sizes)
    suggestion = next((r for r in range(redundant, experts + 1) if (experts + r) % step == 0), None)
    for name, pool, ep in ep_pools:
        slots = experts + redundant
        if ep <= 1 or slots % ep == 0:
            continue
        where = (
            f"the EP size {ep} of spec.{name} ({pool.nodes_per_replica} nodes x {topo.gpus_per_node} GPUs)"
        )
        head = (
            f"{experts} routed + {redundant} redundant = {slots} expert slots per layer do not divide "
            f"evenly over {where}"
        )
        if suggestion is not None:
            problems.append(
                Problem(
                    field,
                    f"{field}: {head}; set {field} to {suggestion} ({experts + suggestion} slots, "
                    f"{(experts + suggestion) // ep} per GPU) or change spec.{name}.nodesPerReplica so that "
                    f"its EP size divides {slots}",
                )
            )
        else:
            problems.append(
                Problem(
                    f"spec.{name}.nodesPerReplica",
                    f"spec.{name}.nodesPerReplica: {head}, and no redundantExperts up to {experts} fixes it; "
                    f"choose nodesPerReplica so that nodesPerReplica x {topo.gpus_per_node} divides {slots}",
                )
            )
    return problems


def _ep(pool: PoolSpec, spec: MoEDeploymentSpec) -> int | None:
    try:
        return pool_layout(pool, spec.topology).ep_size
    except ValueError:
        return None  # attentionDataParallel does not divide the world: reported by check_attention


def _short(values: list[int]) -> str:
    shown = ", ".join(map(str, values[:12]))
    return shown + (", ..." if len(values) > 12 else "")
