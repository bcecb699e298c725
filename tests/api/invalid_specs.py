"""Invalid MoEDeployment specs, each with the field and text its refusal must name.

Reusable beyond the unit tests: an apiserver-level test can build each object with
``build(case)`` and expect the apiserver to refuse every case whose ``layer`` is
``schema`` or ``cel`` even with no webhook installed, and the webhook to refuse the rest.

- ``schema``: OpenAPI validation in the CRD (types, enums, bounds, patterns). Unknown
  fields are rejected under fieldValidation=Strict (kubectl's default), else pruned.
- ``cel``: an x-kubernetes-validations rule in the CRD (transition rules need ``old``).
- ``webhook``: only ``moe_operator.validation.validate`` (catalog, arithmetic, flags).

``validate`` refuses every case, whatever its layer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

Layer = Literal["schema", "cel", "webhook"]

BASE_SPEC: dict[str, Any] = {
    "model": {
        "name": "deepseek-ai/DeepSeek-V3",
        "dtype": "fp8",
        "path": "/models/dsv3",
        "volume": {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
    },
    "engine": {"image": "lmsysorg/sglang:v0.5.23", "extraArgs": ["--trust-remote-code"]},
    "topology": {"gpusPerNode": 8, "gpuMemory": "80Gi"},
    "prefill": {"replicas": 1, "nodesPerReplica": 4, "attentionDataParallel": 32, "deepepMode": "normal"},
    "decode": {"replicas": 2, "nodesPerReplica": 9, "attentionDataParallel": 72, "deepepMode": "low_latency"},
    "router": {"replicas": 2, "policy": "cache_aware"},
    "kvTransfer": {"backend": "mooncake", "ibDevices": ["mlx5_0"]},
    "eplb": {"mode": "operator", "redundantExperts": 32, "refreshInterval": "5m", "minImprovement": 0.03},
    "monitoring": {"podMonitor": True, "prometheusRule": True},
}
"""A valid DeepSeek-V3 P/D spec on H100 nodes (prefill EP32, decode EP72, 256 + 32 experts)."""

_QWEN_ALONE: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-30B-A3B", "dtype": "auto"},
    "prefill": None,
    "decode": {"replicas": 1, "nodesPerReplica": 1, "attentionDataParallel": 8, "deepepMode": "auto"},
    "eplb": {"redundantExperts": 0},
}

_CUSTOM_ARCH: dict[str, Any] = {
    "layers": 24,
    "denseLayers": 1,
    "routedExperts": 64,
    "sharedExperts": 2,
    "expertsPerToken": 6,
    "hiddenSize": 2048,
    "moeIntermediateSize": 1408,
    "totalParameters": "16B",
    "attention": {"type": "MLA", "kvLoraRank": 512, "qkRopeHeadDim": 64},
}


@dataclass(frozen=True)
class InvalidSpec:
    """One refused spec: a JSON merge patch on BASE_SPEC and what the refusal must say."""

    name: str
    patch: dict[str, Any]
    field: str
    text: str
    layer: Layer
    old_patch: dict[str, Any] | None = None  # set for updates: old = BASE_SPEC + old_patch


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def build(case: InvalidSpec) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(spec, old_spec) of a case; old_spec is None for creations."""
    spec = merge_patch(BASE_SPEC, case.patch)
    old = merge_patch(BASE_SPEC, case.old_patch) if case.old_patch is not None else None
    return spec, old


def _arch(**changes: Any) -> dict[str, Any]:
    return {"model": {"name": "acme/MoE-16B", "architecture": merge_patch(_CUSTOM_ARCH, changes)}}


INVALID_SPECS: tuple[InvalidSpec, ...] = (
    # ------------------------------------------------------------------ schema (OpenAPI)
    InvalidSpec(
        "decode-replicas-negative",
        {"decode": {"replicas": -1}},
        "spec.decode.replicas",
        "greater than or equal to 0",
        "schema",
    ),
    InvalidSpec(
        "nodes-per-replica-zero",
        {"prefill": {"nodesPerReplica": 0}},
        "spec.prefill.nodesPerReplica",
        "greater than or equal to 1",
        "schema",
    ),
    InvalidSpec(
        "deepep-mode-unknown",
        {"prefill": {"deepepMode": "fast"}},
        "spec.prefill.deepepMode",
        "low_latency",
        "schema",
    ),
    InvalidSpec("eplb-mode-unknown", {"eplb": {"mode": "dynamic"}}, "spec.eplb.mode", "'operator'", "schema"),
    InvalidSpec(
        "group-backend-unknown",
        {"topology": {"groupBackend": "Deployment"}},
        "spec.topology.groupBackend",
        "LeaderWorkerSet",
        "schema",
    ),
    InvalidSpec(
        "gpu-memory-not-a-quantity",
        {"topology": {"gpuMemory": "80 GB"}},
        "spec.topology.gpuMemory",
        "such as 80Gi",
        "schema",
    ),
    InvalidSpec(
        "refresh-interval-not-a-duration",
        {"eplb": {"refreshInterval": "5 minutes"}},
        "spec.eplb.refreshInterval",
        "such as 5m",
        "schema",
    ),
    InvalidSpec(
        "min-improvement-above-one",
        {"eplb": {"minImprovement": 1.5}},
        "spec.eplb.minImprovement",
        "less than or equal to 1",
        "schema",
    ),
    InvalidSpec(
        "gpus-per-node-too-many",
        {"topology": {"gpusPerNode": 32}},
        "spec.topology.gpusPerNode",
        "less than or equal to 16",
        "schema",
    ),
    InvalidSpec(
        "model-path-relative",
        {"model": {"path": "models/dsv3"}},
        "spec.model.path",
        "absolute path",
        "schema",
    ),
    InvalidSpec(
        "ib-device-with-space",
        {"kvTransfer": {"ibDevices": ["mlx5 0"]}},
        "spec.kvTransfer.ibDevices[0]",
        "mlx5_0",
        "schema",
    ),
    InvalidSpec(
        "too-many-extra-args",
        {"engine": {"extraArgs": ["--trust-remote-code"] * 65}},
        "spec.engine.extraArgs",
        "at most 64",
        "schema",
    ),
    InvalidSpec("unknown-field", {"decode": {"gpus": 8}}, "spec.decode.gpus", "remove it", "schema"),
    InvalidSpec(
        "router-policy-unknown",
        {"router": {"policy": "least_loaded"}},
        "spec.router.policy",
        "cache_aware",
        "schema",
    ),
    # ------------------------------------------------------------------ cel (CRD rules)
    InvalidSpec(
        "attention-dp-not-a-divisor",
        {"decode": {"attentionDataParallel": 7}},
        "spec.decode.attentionDataParallel",
        "must divide",
        "cel",
    ),
    InvalidSpec(
        "attention-tp-crosses-nvlink",
        {"decode": {"attentionDataParallel": 4}},
        "spec.decode.attentionDataParallel",
        "NVLink domain",
        "cel",
    ),
    InvalidSpec(
        "prefill-attention-tp-crosses-nvlink",
        {"prefill": {"attentionDataParallel": 2}},
        "spec.prefill.attentionDataParallel",
        "at least 4",
        "cel",
    ),
    InvalidSpec(
        "nvlink-domain-not-whole-nodes",
        {"topology": {"nvlinkDomainSize": 12}},
        "spec.topology.nvlinkDomainSize",
        "multiple of spec.topology.gpusPerNode",
        "cel",
    ),
    InvalidSpec("volume-without-path", {"model": {"path": None}}, "spec.model.path", "required", "cel"),
    InvalidSpec(
        "redundant-experts-with-eplb-off",
        {"eplb": {"mode": "off"}},
        "spec.eplb.redundantExperts",
        "set spec.eplb.mode to operator",
        "cel",
    ),
    InvalidSpec(
        "dist-init-port-equals-port",
        {"engine": {"distInitPort": 30000}},
        "spec.engine.distInitPort",
        "choose another port",
        "cel",
    ),
    InvalidSpec(
        "gqa-architecture-without-kv-heads",
        _arch(attention={"type": "GQA", "kvLoraRank": None}),
        "spec.model.architecture.attention.kvHeads",
        "num_key_value_heads",
        "cel",
    ),
    InvalidSpec(
        "top-k-above-experts",
        _arch(expertsPerToken=40, routedExperts=32),
        "spec.model.architecture.expertsPerToken",
        "cannot exceed routedExperts",
        "cel",
    ),
    # ------------------------------------------------------------------ cel transition rules (updates)
    InvalidSpec(
        "update-model-name",
        {"model": {"name": "deepseek-ai/DeepSeek-R1"}},
        "spec.model.name",
        "immutable",
        "cel",
        old_patch={},
    ),
    InvalidSpec(
        "update-gpus-per-node",
        {"topology": {"gpusPerNode": 4}},
        "spec.topology.gpusPerNode",
        "immutable",
        "cel",
        old_patch={},
    ),
    InvalidSpec(
        "update-remove-prefill",
        {"prefill": None},
        "spec.prefill",
        "cannot be removed in place",
        "cel",
        old_patch={},
    ),
    InvalidSpec(
        "update-add-prefill",
        {},
        "spec.prefill",
        "cannot be added in place",
        "cel",
        # alone, decode also computes prompts: not on the low-latency kernels (the webhook refuses that)
        old_patch={"prefill": None, "decode": {"deepepMode": "auto"}},
    ),
    InvalidSpec(
        "update-architecture",
        _arch(layers=28),
        "spec.model.architecture",
        "immutable",
        "cel",
        old_patch=_arch(),
    ),
    # ------------------------------------------------------------------ webhook (catalog, arithmetic, flags)
    InvalidSpec(
        "unknown-model-without-architecture",
        {"model": {"name": "acme/MoE-9000"}},
        "spec.model.architecture",
        "not in the operator's model catalog",
        "webhook",
    ),
    InvalidSpec(
        "total-parameters-below-experts",
        _arch(totalParameters="1B"),
        "spec.model.architecture.totalParameters",
        "smaller than the routed experts",
        "webhook",
    ),
    InvalidSpec(
        "experts-not-divisible-by-ep",
        {"decode": {"nodesPerReplica": 8, "attentionDataParallel": 64}},
        "spec.eplb.redundantExperts",
        "set spec.eplb.redundantExperts to 64",
        "webhook",
    ),
    InvalidSpec(
        "experts-not-divisible-no-redundancy-fixes",
        {
            "model": {"name": "mistralai/Mixtral-8x7B-v0.1", "dtype": "auto"},
            "decode": {"nodesPerReplica": 3, "attentionDataParallel": 24},
            "eplb": {"redundantExperts": 0},
        },
        "spec.decode.nodesPerReplica",
        "no redundantExperts",
        "webhook",
    ),
    InvalidSpec(
        "redundant-experts-without-ep",
        merge_patch(_QWEN_ALONE, {"decode": {"allToAllBackend": "none"}, "eplb": {"redundantExperts": 8}}),
        "spec.eplb.redundantExperts",
        "no pool has expert parallelism",
        "webhook",
    ),
    InvalidSpec(
        "redundant-experts-above-experts",
        {"eplb": {"redundantExperts": 300}},
        "spec.eplb.redundantExperts",
        "use at most 256",
        "webhook",
    ),
    InvalidSpec(
        "weights-do-not-fit",
        {"decode": {"nodesPerReplica": 1, "attentionDataParallel": 8}},
        "spec.decode.nodesPerReplica",
        "to at least 2",
        "webhook",
    ),
    InvalidSpec(
        "kv-of-one-request-never-fits",
        {"engine": {"extraArgs": ["--context-length", "2000000"]}},
        "spec.decode.nodesPerReplica",
        "shorter --context-length",
        "webhook",
    ),
    InvalidSpec(
        "deepep-on-one-gpu",
        merge_patch(_QWEN_ALONE, {"topology": {"gpusPerNode": 1}, "decode": {"attentionDataParallel": 1}}),
        "spec.decode.allToAllBackend",
        "set it to none",
        "webhook",
    ),
    InvalidSpec(
        "deepep-on-six-gpus",
        merge_patch(_QWEN_ALONE, {"topology": {"gpusPerNode": 6}, "decode": {"attentionDataParallel": 6}}),
        "spec.decode.allToAllBackend",
        "2, 4, 8 ranks",
        "webhook",
    ),
    InvalidSpec(
        "owned-flag-tp-size",
        {"engine": {"extraArgs": ["--tp-size", "16"]}},
        "spec.engine.extraArgs[0]",
        "--tp-size is set by the operator",
        "webhook",
    ),
    InvalidSpec(
        "owned-flag-equals-form",
        {"decode": {"extraArgs": ["--cuda-graph-max-bs-decode", "128", "--ep-num-redundant-experts=16"]}},
        "spec.decode.extraArgs[2]",
        "spec.eplb.redundantExperts",
        "webhook",
    ),
    InvalidSpec(
        "owned-flag-underscore-form",
        {"prefill": {"extraArgs": ["--disaggregation_mode", "prefill"]}},
        "spec.prefill.extraArgs[0]",
        "did you mean --disaggregation-mode",
        "webhook",
    ),
    InvalidSpec(
        "owned-router-flag",
        {"router": {"extraArgs": ["--policy", "random"]}},
        "spec.router.extraArgs[0]",
        "spec.router.policy",
        "webhook",
    ),
    InvalidSpec(
        "volume-with-two-sources",
        {"model": {"volume": {"persistentVolumeClaim": {"claimName": "models"}, "hostPath": {"path": "/m"}}}},
        "spec.model.volume",
        "exactly one volume source",
        "webhook",
    ),
    InvalidSpec(
        "env-without-name",
        {"engine": {"env": [{"value": "INFO"}]}},
        "spec.engine.env[0].name",
        "name: NCCL_DEBUG",
        "webhook",
    ),
    # Bounded durations: a CEL rule on each field (api.types.DurationRange), also the webhook's words.
    InvalidSpec(
        "refresh-interval-too-short",
        {"eplb": {"refreshInterval": "1s"}},
        "spec.eplb.refreshInterval",
        "must be a duration from 10s to 24h",
        "cel",
    ),
    InvalidSpec(
        "history-too-long",
        {"eplb": {"history": "1000h"}},
        "spec.eplb.history",
        "must be a duration from 1m to 24h",
        "cel",
    ),
    InvalidSpec(
        "min-interval-too-short",
        {"eplb": {"minInterval": "5s"}},
        "spec.eplb.minInterval",
        "must be a duration from 10s to 24h",
        "cel",
    ),
    InvalidSpec(
        "startup-timeout-too-short",
        {"engine": {"startupTimeout": "10s"}},
        "spec.engine.startupTimeout",
        "must be a duration from 1m to 4h",
        "cel",
    ),
    InvalidSpec(
        "startup-timeout-too-long",
        {"engine": {"startupTimeout": "24h"}},
        "spec.engine.startupTimeout",
        "must be a duration from 1m to 4h",
        "cel",
    ),
    InvalidSpec(
        "alert-for-too-long",
        {"monitoring": {"alertFor": "48h"}},
        "spec.monitoring.alertFor",
        "must be a duration from 1m to 24h",
        "cel",
    ),
    InvalidSpec(
        "resources-request-gpus",
        {"engine": {"resources": {"limits": {"nvidia.com/gpu": 8}}}},
        "spec.engine.resources.limits",
        "set gpusPerNode instead",
        "webhook",
    ),
    InvalidSpec(
        "bootstrap-port-collides",
        {"kvTransfer": {"bootstrapPort": 30000}},
        "spec.kvTransfer.bootstrapPort",
        "choose another port",
        "webhook",
    ),
    InvalidSpec(
        "history-shorter-than-refresh",
        {"eplb": {"history": "1m"}},
        "spec.eplb.history",
        "at least 5m",
        "webhook",
    ),
)

METADATA_CASES: tuple[tuple[str, dict[str, Any], str, str], ...] = (
    ("name-too-long", {"name": "a" * 41}, "metadata.name", "at most 40 characters"),
)
"""Object-level CEL rules (apiserver only): (name, metadata, field, text)."""
