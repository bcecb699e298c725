"""Facts derived from a spec that admission, planning and rendering all need.

One place computes an instance's layout, the model's architecture and its bytes per
weight, so the webhook and the renderer can never disagree about them.
"""

from __future__ import annotations

from typing import Literal

from ..capacity.layout import InstanceLayout
from ..models.architecture import BYTES_PER_ELEMENT, Attention, MoEArchitecture
from ..models.catalog import lookup
from .model_spec import ModelArchitecture, ModelSpec
from .spec import MoEDeploymentSpec, PoolSpec
from .topology_spec import TopologySpec
from .types import parse_count

Pool = Literal["prefill", "decode"]


def pools(spec: MoEDeploymentSpec) -> dict[Pool, PoolSpec]:
    """The pools that exist, prefill first (decode serves alone without prefill)."""
    out: dict[Pool, PoolSpec] = {}
    if spec.prefill is not None:
        out["prefill"] = spec.prefill
    out["decode"] = spec.decode
    return out


def architecture_from_spec(name: str, arch: ModelArchitecture) -> MoEArchitecture:
    """The catalog form of a user-declared architecture."""
    attention = arch.attention
    return MoEArchitecture(
        name=name,
        layers=arch.layers,
        dense_layers=arch.dense_layers,
        routed_experts=arch.routed_experts,
        shared_experts=arch.shared_experts,
        experts_per_token=arch.experts_per_token,
        expert_groups=arch.expert_groups,
        topk_groups=arch.topk_groups,
        hidden_size=arch.hidden_size,
        moe_intermediate_size=arch.moe_intermediate_size,
        total_params=parse_count(arch.total_parameters),
        active_params=parse_count(arch.active_parameters) if arch.active_parameters is not None else 0,
        attention=Attention(
            kind=attention.type,
            num_heads=0,
            kv_heads=attention.kv_heads or 1,
            head_dim=attention.head_dim,
            kv_lora_rank=attention.kv_lora_rank or 0,
            qk_rope_head_dim=attention.qk_rope_head_dim or 0,
        ),
        native_dtype=arch.native_dtype,
        intermediate_size=arch.dense_intermediate_size or 0,
        fp8_block=(arch.fp8_block_size[0], arch.fp8_block_size[1]) if arch.fp8_block_size else None,
    )


def resolve_architecture(model: ModelSpec) -> MoEArchitecture | None:
    """spec.model.architecture when given, else the catalog entry; None for an unknown model."""
    if model.architecture is not None:
        return architecture_from_spec(model.name, model.architecture)
    return lookup(model.name)


def weight_dtype(model: ModelSpec, arch: MoEArchitecture) -> str:
    """spec.model.dtype with auto resolved to the checkpoint's native precision."""
    return arch.native_dtype if model.dtype == "auto" else model.dtype


def bytes_per_param(model: ModelSpec, arch: MoEArchitecture) -> float:
    """Bytes one stored weight takes."""
    return BYTES_PER_ELEMENT[weight_dtype(model, arch)]


def kv_bytes_per_element(model: ModelSpec) -> float:
    """Bytes one cached KV number takes (auto = bf16 activations)."""
    return 2.0 if model.kv_cache_dtype == "auto" else BYTES_PER_ELEMENT[model.kv_cache_dtype]


def world_size(pool: PoolSpec, topology: TopologySpec) -> int:
    """GPUs of one instance: nodesPerReplica x gpusPerNode."""
    return pool.nodes_per_replica * topology.gpus_per_node


def attention_dp(pool: PoolSpec, topology: TopologySpec) -> int:
    """Attention data-parallel groups, defaulting to the whole world (attention TP 1)."""
    return pool.attention_data_parallel or world_size(pool, topology)


def nvlink_domain_size(topology: TopologySpec) -> int:
    """GPUs in one NVLink domain: declared, else one node."""
    return topology.nvlink_domain_size or topology.gpus_per_node


def pool_layout(pool: PoolSpec, topology: TopologySpec) -> InstanceLayout:
    """The parallel layout of one instance of ``pool`` (raises ValueError if inconsistent)."""
    return InstanceLayout(
        nodes=pool.nodes_per_replica,
        gpus_per_node=topology.gpus_per_node,
        attention_dp=attention_dp(pool, topology),
        expert_parallel=pool.all_to_all_backend != "none" and world_size(pool, topology) > 1,
    )
