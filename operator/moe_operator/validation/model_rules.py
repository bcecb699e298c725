"""Rules about the model: known or described, a consistent architecture, one volume source."""

from __future__ import annotations

from ..api.spec import MoEDeploymentSpec
from ..api.types import parse_count
from ..models.catalog import known_names, lookup
from .problem import Problem

_ARCH = "spec.model.architecture"


def check_model(spec: MoEDeploymentSpec) -> list[Problem]:
    """Unknown models need an architecture; a described one must be self-consistent."""
    model = spec.model
    problems: list[Problem] = []
    if model.architecture is None:
        if lookup(model.name) is None:
            problems.append(
                Problem(
                    _ARCH,
                    f"spec.model.name {model.name!r} is not in the operator's model catalog, so its layers, "
                    f"experts and KV size are unknown; add {_ARCH} (layers, denseLayers, routedExperts, "
                    "expertsPerToken, hiddenSize, moeIntermediateSize, totalParameters, attention) or use a "
                    "catalog model: " + ", ".join(known_names()),
                )
            )
    else:
        problems.extend(_check_architecture(spec))
    if model.volume is not None:
        sources = [k for k, v in model.volume.items() if v is not None]
        if len(sources) != 1:
            problems.append(
                Problem(
                    "spec.model.volume",
                    "spec.model.volume must name exactly one volume source (persistentVolumeClaim, "
                    "hostPath, "
                    f"nfs, csi, ...), found {len(sources)} ({', '.join(sources) or 'none'}); keep one",
                )
            )
        if model.path is None:
            problems.append(
                Problem(
                    "spec.model.path",
                    "spec.model.path is required with spec.model.volume: set the directory inside the "
                    "volume's "
                    "mount that holds the weights, such as /models/dsv3",
                )
            )
    return problems


def _check_architecture(spec: MoEDeploymentSpec) -> list[Problem]:
    arch = spec.model.architecture
    assert arch is not None
    problems: list[Problem] = []
    attention = arch.attention
    if attention.type == "GQA" and attention.kv_heads is None:
        problems.append(
            Problem(
                f"{_ARCH}.attention.kvHeads",
                f"{_ARCH}.attention.kvHeads is required for GQA attention: set num_key_value_heads from the "
                "model's config.json",
            )
        )
    if attention.type == "MLA" and (attention.kv_lora_rank is None or attention.qk_rope_head_dim is None):
        problems.append(
            Problem(
                f"{_ARCH}.attention.kvLoraRank",
                f"{_ARCH}.attention.kvLoraRank and qkRopeHeadDim are required for MLA attention: set "
                "kv_lora_rank and qk_rope_head_dim from the model's config.json (512 and 64 for DeepSeek-V3)",
            )
        )
    if arch.dense_layers >= arch.layers:
        problems.append(
            Problem(
                f"{_ARCH}.denseLayers",
                f"{_ARCH}.denseLayers ({arch.dense_layers}) must be smaller than layers ({arch.layers}): "
                "an MoE model needs at least one expert layer; set first_k_dense_replace from config.json",
            )
        )
    if arch.experts_per_token > arch.routed_experts:
        problems.append(
            Problem(
                f"{_ARCH}.expertsPerToken",
                f"{_ARCH}.expertsPerToken ({arch.experts_per_token}) cannot exceed routedExperts "
                f"({arch.routed_experts}); set num_experts_per_tok from config.json",
            )
        )
    if arch.topk_groups > arch.expert_groups:
        problems.append(
            Problem(
                f"{_ARCH}.topkGroups",
                f"{_ARCH}.topkGroups ({arch.topk_groups}) cannot exceed expertGroups ({arch.expert_groups}); "
                "set topk_group and n_group from config.json",
            )
        )
    if arch.routed_experts % arch.expert_groups:
        problems.append(
            Problem(
                f"{_ARCH}.expertGroups",
                f"{_ARCH}.expertGroups ({arch.expert_groups}) must divide routedExperts "
                f"({arch.routed_experts}); "
                "set n_group from config.json, or 1 for no groups",
            )
        )
    moe_layers = max(0, arch.layers - arch.dense_layers)
    routed = moe_layers * arch.routed_experts * 3 * arch.hidden_size * arch.moe_intermediate_size
    total = parse_count(arch.total_parameters)
    if total < routed:
        problems.append(
            Problem(
                f"{_ARCH}.totalParameters",
                f"{_ARCH}.totalParameters ({total:,}) is smaller than the routed experts alone ({routed:,} = "
                f"{moe_layers} MoE layers x {arch.routed_experts} experts x 3 x {arch.hidden_size} x "
                f"{arch.moe_intermediate_size}); give the model's total parameter count, such as 671B",
            )
        )
    return problems
