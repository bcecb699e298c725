"""MoEDeployment spec: the one source of the CRD's spec schema, its defaults and CEL rules.

Descriptions are what `kubectl explain` shows: each says what the field does, in which
unit, and why a value matters. The generator appends allowed values, bounds and
defaults, so the prose does not repeat them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_validator

from moe_contract.engine import EplbMode

from ..hardware import lookup_profile
from .base import APIObject, cel, rules, section
from .types import Duration, DurationRange, EmbeddedObject, LabelKey, ParamCount, Quantity

Arg = Annotated[str, StringConstraints(max_length=1024)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
IBDevice = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=64)]
LabelValue = Annotated[str, StringConstraints(max_length=63)]

DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery


# --------------------------------------------------------------------------- model


class AttentionArchitecture(APIObject):
    """Attention shape of a model that is not in the catalog; sets its KV bytes per token."""

    model_config = rules(
        cel(
            "self.type == 'GQA' ? has(self.kvHeads) : (has(self.kvLoraRank) && has(self.qkRopeHeadDim))",
            "GQA attention needs kvHeads; MLA attention needs kvLoraRank and qkRopeHeadDim",
        )
    )

    type: Literal["MLA", "GQA"] = Field(
        description="Attention kind. MLA (DeepSeek-style multi-head latent attention) caches one "
        "compressed latent per layer shared by all heads; GQA (grouped-query, also plain multi-head "
        "attention) caches a key and a value for every KV head."
    )
    kv_heads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GQA only: number of key-value heads (config.json num_key_value_heads). Attention "
        "tensor parallelism shards the KV cache over at most this many GPUs.",
    )
    head_dim: int = Field(
        default=128, ge=1, le=1024, description="GQA only: size of one attention head (config.json head_dim)."
    )
    kv_lora_rank: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="MLA only: width of the compressed latent KV (config.json kv_lora_rank, 512 for "
        "DeepSeek-V3).",
    )
    qk_rope_head_dim: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="MLA only: width of the decoupled RoPE key cached next to the latent "
        "(config.json qk_rope_head_dim, 64 for DeepSeek-V3).",
    )


class ModelArchitecture(APIObject):
    """Architecture facts of a model the operator's catalog does not know."""

    model_config = rules(
        cel("self.denseLayers < self.layers", "denseLayers must be smaller than layers", ".denseLayers"),
        cel(
            "self.expertsPerToken <= self.routedExperts",
            "expertsPerToken (top-k) cannot exceed routedExperts",
            ".expertsPerToken",
        ),
        cel("self.topkGroups <= self.expertGroups", "topkGroups cannot exceed expertGroups", ".topkGroups"),
        cel(
            "self.routedExperts % self.expertGroups == 0",
            "routedExperts must be a multiple of expertGroups",
            ".expertGroups",
        ),
    )

    layers: int = Field(
        ge=1, le=1024, description="Transformer layers (config.json num_hidden_layers), MTP layers excluded."
    )
    dense_layers: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Leading layers with a dense FFN instead of experts (config.json first_k_dense_replace). "
        "MoE layers = layers - denseLayers.",
    )
    routed_experts: int = Field(
        ge=2,
        le=4096,
        description="Routed experts per MoE layer (n_routed_experts / num_experts / num_local_experts).",
    )
    shared_experts: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Always-active experts per MoE layer (n_shared_experts); never dispatched.",
    )
    experts_per_token: int = Field(
        ge=1, le=64, description="Experts each token is routed to (top-k, num_experts_per_tok)."
    )
    expert_groups: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Expert groups for node-limited routing (config.json n_group); 1 means no groups. "
        "Hierarchical placement keeps a group's experts on one node.",
    )
    topk_groups: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Groups a token may draw its experts from (config.json topk_group).",
    )
    hidden_size: int = Field(ge=1, le=65536, description="Model width d (config.json hidden_size).")
    moe_intermediate_size: int = Field(
        ge=1, le=131072, description="FFN width of one routed expert (config.json moe_intermediate_size)."
    )
    total_parameters: ParamCount = Field(
        description="Total parameters, as an integer or with a K/M/B/T suffix (powers of 1000), "
        "for example 671B. Sets the weight bytes of everything that is not a routed expert."
    )
    active_parameters: ParamCount | None = Field(
        default=None, description="Parameters used per token (informational), for example 37B."
    )
    native_dtype: Literal["bf16", "fp16", "fp8", "fp4"] = Field(
        default="bf16",
        description="Precision of the published checkpoint; used when spec.model.dtype is auto.",
    )
    dense_intermediate_size: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Width of the dense FFN layers (config.json intermediate_size; 18432 for DeepSeek-V3). "
        "With denseLayers and an FP8 block-quantised checkpoint, the operator checks that the dense FFN's "
        "tensor-parallel split keeps whole blocks on every GPU, as SGLang does at weight load.",
    )
    fp8_block_size: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="Block of an FP8 block-quantised checkpoint, [rows, columns] (config.json "
        "quantization_config.weight_block_size; [128, 128] for DeepSeek-V3). Unset: not block-quantised.",
    )
    attention: AttentionArchitecture = Field(
        description="Attention shape, which sets the KV cache bytes per token."
    )


class ModelSpec(APIObject):
    """The model to serve and where its weights come from."""

    model_config = rules(
        cel(
            "!has(self.volume) || has(self.path)",
            "spec.model.path is required when spec.model.volume is set: set it to where the weights are "
            "found inside the mounted volume",
            ".path",
            "FieldValueRequired",
        ),
        cel(
            "has(self.architecture) == has(oldSelf.architecture)",
            "spec.model.architecture cannot be added or removed in place; create a new MoEDeployment",
            ".architecture",
        ),
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Hugging Face model id (for example deepseek-ai/DeepSeek-V3) or a catalog alias "
        "(deepseek-v3, kimi-k2, qwen3-235b-a22b, ...), matched case-insensitively. The catalog supplies "
        "layers, experts, top-k and KV bytes per token; a model outside it needs spec.model.architecture. "
        "Immutable: another model means new pods everywhere, so create a new MoEDeployment.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "spec.model.name is immutable: serving another model replaces every pod; "
                    "create a new MoEDeployment instead",
                )
            ]
        },
    )
    dtype: Literal["auto", "bf16", "fp16", "fp8", "fp4"] = Field(
        default="auto",
        description="Precision the weights are stored in (bytes per parameter for capacity planning: "
        "bf16/fp16 2, fp8 1, fp4 0.5). auto takes the checkpoint's native precision from the catalog or "
        "from architecture.nativeDtype (fp8 for DeepSeek-V3 and Kimi-K2). The checkpoint must already be "
        "in this precision, or the engine must quantize it on load (--quantization in engine.extraArgs).",
    )
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto",
        description="Precision of the KV cache (SGLang --kv-cache-dtype). auto keeps the activations' "
        "precision (bf16, 2 bytes per number); fp8 halves the cache and doubles the tokens that fit.",
    )
    path: str | None = Field(
        default=None,
        pattern=r"^/",
        max_length=1024,
        description="Absolute directory holding the weights inside the engine container (passed as "
        "--model-path). Required with volume, which is mounted read-only at this path. Without volume "
        "and path, each pod downloads spec.model.name from Hugging Face at start-up.",
    )
    volume: EmbeddedObject | None = Field(
        default=None,
        description="Where the weights live: any Kubernetes volume source (persistentVolumeClaim, "
        "hostPath, nfs, csi, image, ...), exactly one of them, mounted read-only at path on every pod "
        "of every pool. A ReadOnlyMany PVC or node-local copies avoid every node pulling hundreds of GB.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="Architecture facts for a model outside the catalog (required then). For a catalog "
        "model it overrides the catalog entry. Immutable once set.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self == oldSelf", "spec.model.architecture is immutable; create a new MoEDeployment")
            ]
        },
    )


# --------------------------------------------------------------------------- engine


class EngineSpec(APIObject):
    """The SGLang engine container shared by the prefill and decode pools."""

    model_config = rules(
        cel(
            "!has(self.port) || !has(self.distInitPort) || self.port != self.distInitPort",
            "spec.engine.port and spec.engine.distInitPort must differ: choose another port for distInitPort",
            ".distInitPort",
        )
    )

    image: Name = Field(
        default=DEFAULT_IMAGE,
        description="Container image with SGLang, DeepEP and the operator's runtime (launcher, sidecar, "
        "EPLB plugin). The router uses it too unless spec.router.image is set.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Kubernetes image pull policy of the engine containers."
    )
    image_pull_secrets: list[Name] = Field(
        default_factory=list,
        max_length=8,
        description="Names of Secrets in this namespace used to pull the images.",
    )
    extra_args: list[Arg] = Field(
        default_factory=list,
        max_length=64,
        description="Extra SGLang launch_server arguments for both pools, one token per item "
        '(["--chunked-prefill-size", "8192"] or ["--chunked-prefill-size=8192"]). Admission reads them '
        "as SGLang 0.5.23's parser does (aliases, abbreviations, value types and choices) and refuses "
        "unknown, removed and ambiguous flags (--cuda-graph-max-bs is now --cuda-graph-max-bs-decode "
        "or --cuda-graph-max-bs-prefill); flags the operator derives from this spec, under any "
        "spelling (--tp-size or --tp, --ep-size or --ep, --attn-dp-size, --nnodes, --node-rank, "
        "--dist-init-addr, --moe-a2a-backend, --deepep-mode, --disaggregation-*, --enable-eplb, "
        "--ep-num-redundant-experts, --init-expert-location, --model-path or --model, --host, --port, "
        "--kv-cache-dtype, ...): set the spec field instead; an --eplb-algorithm SGLang does not know; "
        "and flags that bypass the operator's expert placement (--eplb-min-rebalancing-utilization-"
        "threshold below 1.0, elastic EP, --config). --mem-fraction-static and --context-length are "
        "honoured by the admission capacity check.",
    )
    env: list[EmbeddedObject] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables (Kubernetes EnvVar objects: name plus value or "
        "valueFrom) for every engine container, for example NCCL_IB_HCA or SGLANG_* tuning knobs.",
    )
    resources: EmbeddedObject | None = Field(
        default=None,
        description="CPU, memory and other resources (Kubernetes ResourceRequirements) of each engine "
        "container. The GPU request is set by the operator from spec.topology (gpusPerNode of "
        "gpuResourceName per pod) and must not appear here.",
    )
    port: int = Field(default=30000, ge=1, le=65535, description="HTTP port of every engine (SGLang --port).")
    dist_init_port: int = Field(
        default=20102,
        ge=1,
        le=65535,
        description="TCP port on each group's leader pod (rank 0) where the other ranks rendezvous "
        "(the port part of --dist-init-addr).",
    )
    kernel_cache_claim: Name | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="PersistentVolumeClaim (in the deployment's namespace, ReadWriteMany) that keeps the "
        "kernels SGLang compiles at start (DeepGEMM, Triton, TorchInductor, FlashInfer, CUDA) across "
        "group restarts: a cold wide-EP start spends 10-20 minutes compiling DeepGEMM kernels. Each "
        "node writes its own directory, keyed by engine image and GPU type. Unset: kernels are "
        "compiled again at every group start. Needs persistentVolumeClaim among the platform's "
        "volume sources.",
    )
    shared_memory_size: Quantity = Field(
        default="64Gi",
        description="Size of the memory-backed /dev/shm of each engine pod (NCCL and DeepEP use it), "
        "a Kubernetes quantity such as 64Gi. It counts against the pod's memory.",
    )
    startup_timeout: Annotated[Duration, DurationRange("1m", "4h")] | None = Field(
        default=None,
        description="How long a pod group may take from scheduling to every rank being ready (weights "
        "loaded, DeepGEMM kernels compiled, DeepEP and CUDA graphs initialised) before the operator "
        "restarts the whole group, as a duration such as 30m. Ranks of one NCCL/DeepEP world cannot "
        "rejoin singly, so a hung start always restarts the group. Unset: 60m for a multi-node "
        "instance of an FP8 block-quantised model (a cold start compiles DeepGEMM kernels; public "
        "wide-EP deployments allow 45 to 100 minutes), else 30m. From 1m (no engine loads its weights "
        "and initialises faster, so less would restart every group in a loop) to 4h (a hung group "
        "holds whole GPU nodes that long).",
    )


# --------------------------------------------------------------------------- topology


def _no_crd_default(extra: dict[str, Any] | None = None) -> Any:
    """Schema hook: the CRD gets no default for this field, so a spec that leaves it out stays without
    it and spec.topology.hardware can supply it (the Python default applies when neither does)."""

    def hook(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update(extra or {})

    return hook


PROFILE_FIELDS = {
    "gpusPerNode": "gpus_per_node",
    "gpuMemory": "gpu_memory",
    "nvlinkDomainSize": "nvlink_domain_size",
    "hostNetwork": "host_network",
    "rdmaResourceName": "rdma_resource_name",
}
"""Topology fields a hardware profile fills in when the spec leaves them out (wire name -> profile field)."""


class TopologySpec(APIObject):
    """What the nodes look like and where a pod group may be placed."""

    model_config = rules(
        cel(
            "!has(self.nvlinkDomainSize) || !has(self.gpusPerNode) || self.nvlinkDomainSize % self.gpusPerNode == 0",
            "spec.topology.nvlinkDomainSize must be a whole number of nodes: set it to a multiple of spec.topology.gpusPerNode",
            ".nvlinkDomainSize",
        )
    )

    hardware: LabelValue | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Hardware profile of the nodes (h100-ib, h100-roce, h200-ib, h200-roce, b200-ib, "
        "gb200-nvl72, or one the platform adds): fills in gpusPerNode, gpuMemory, nvlinkDomainSize, "
        "hostNetwork, rdmaResourceName and the GPU nodeSelector where the spec leaves them out, and "
        "gives the recipe its fabric facts (environment, two-batch overlap, DeepEP limits, batch per "
        "rank). docs/recipes.md lists each profile and the source of every value. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "spec.topology.hardware is immutable: every pod group is shaped by it; create a new "
                    "MoEDeployment for other hardware",
                )
            ]
        },
    )
    gpus_per_node: int = Field(
        default=8,
        ge=1,
        le=16,
        description="GPUs of each node, all given to the one engine pod that runs there (8 on "
        "H100/H200/B200 nodes, 4 on GB200 trays). An instance's GPU world, and so its EP size, is "
        "nodesPerReplica x gpusPerNode. Immutable: every group's shape depends on it. At most 16, the "
        "most GPUs any node has. Default: the hardware profile's, else 8.",
        json_schema_extra=_no_crd_default(
            {
                "x-kubernetes-validations": [
                    cel(
                        "self == oldSelf",
                        "spec.topology.gpusPerNode is immutable: every pod group is shaped by it; "
                        "create a new MoEDeployment for other nodes",
                    )
                ]
            }
        ),
    )
    gpu_memory: Quantity = Field(
        default="80Gi",
        description="Memory of one GPU, a Kubernetes quantity (80Gi for H100, 141Gi for H200, 184Gi "
        "for GB200). Admission checks that each instance's weights plus a minimal KV cache fit. "
        "Default: the hardware profile's, else 80Gi.",
        json_schema_extra=_no_crd_default(),
    )
    gpu_resource_name: Name = Field(
        default="nvidia.com/gpu", description="Extended resource name the engine pods request GPUs by."
    )
    nvlink_domain_label: LabelKey = Field(
        default="nvidia.com/gpu.clique",
        description="Node label whose value names the node's NVLink domain (set by the NVIDIA GPU "
        "operator on multi-node NVLink systems such as GB200 NVL72). Nodes without the label are "
        "each their own domain. A pod group is placed inside one domain when one has room for it.",
    )
    nvlink_domain_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GPUs joined by NVLink in one domain: 72 for GB200 NVL72 racks. Unset means one "
        "node (gpusPerNode). Attention tensor parallelism must fit inside one domain. At most 1024, "
        "above the largest NVLink domain built (576 GPUs).",
    )
    rack_label: LabelKey = Field(
        default="topology.kubernetes.io/zone",
        description="Node label grouping nodes that share a fast network (rack, spine block or zone). "
        "When no NVLink domain can hold a group, the group stays inside one value of this label.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Labels a node must have to run engine pods (in addition to the operator's own "
        "NVLink-domain pinning).",
    )
    tolerations: list[EmbeddedObject] = Field(
        default_factory=list,
        max_length=32,
        description="Kubernetes tolerations of the engine pods, for example for tainted GPU nodes.",
    )
    group_backend: Literal["auto", "StatefulSet", "LeaderWorkerSet"] = Field(
        default="auto",
        description="What runs one engine instance's pod group: StatefulSet (one per instance, with a "
        "headless Service; no extra controller) or LeaderWorkerSet (one per instance; needs the "
        "LeaderWorkerSet controller, leaderworkerset.x-k8s.io/v1). auto takes LeaderWorkerSet when "
        "the cluster serves it when the deployment is first reconciled, else StatefulSet, and keeps "
        "that choice (status.pools.*.groupBackend). Either way the operator restarts a failed group "
        "whole with backoff and rolls spec changes one instance at a time. Changing it on a running "
        "deployment replaces every instance at once.",
    )
    host_network: bool = Field(
        default=False,
        description="Run engine pods in the host network namespace, as many RDMA/RoCE setups need for "
        "DeepEP and KV transfer. Ports must then be free on the node. Default: the hardware "
        "profile's, else false.",
        json_schema_extra=_no_crd_default(),
    )
    rdma_resource_name: Name | None = Field(
        default=None,
        description="Extended resource for RDMA NICs requested once per engine pod (for example rdma/ib "
        "or rdma/rdma_shared_device_a); unset requests none (or the hardware profile's).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_from_hardware(cls, data: Any) -> Any:
        """Fields the spec leaves out come from its hardware profile (an unknown name is refused here,
        naming the known ones)."""
        if not isinstance(data, dict) or not data.get("hardware"):
            return data
        profile = lookup_profile(str(data["hardware"]))
        filled = dict(data)
        for wire, attr in PROFILE_FIELDS.items():
            if wire not in filled and attr not in filled:
                value = getattr(profile, attr)
                if value is not None:
                    filled[wire] = value
        if not filled.get("nodeSelector") and not filled.get("node_selector"):
            filled["nodeSelector"] = {GPU_PRODUCT_LABEL: profile.gpu_product}
        return filled


# --------------------------------------------------------------------------- pools


class PoolSpec(APIObject):
    """A pool of identical engine instances; each instance is one pod group spanning nodes."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=256,
        description="Engine instances in the pool. Each instance is an independent copy of the model "
        "(one pod group) behind the router. 0 stops the pool but keeps the object. At most 256: every "
        "instance is a pod group the operator plans, watches, probes and balances; serve more from "
        "several MoEDeployments.",
    )
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=128,
        description="Nodes one instance spans, one pod per node. The instance's GPU world = "
        "nodesPerReplica x gpusPerNode; it is also the instance's expert-parallel (EP) size, so "
        "routed experts + eplb.redundantExperts must divide evenly by it. Weights plus a minimal KV "
        "cache must fit the world's memory. At most 128 nodes: an EP world larger than a model's "
        "expert slots leaves GPUs without experts, and one NCCL world that large is one failure domain.",
    )
    attention_data_parallel: int | None = Field(
        default=None,
        ge=1,
        le=2048,
        description="Attention data-parallel groups per instance (SGLang --attn-dp-size). Each group "
        "runs attention for its own requests with its own KV cache; attention tensor parallelism = "
        "world / attentionDataParallel, which must divide evenly and fit inside one NVLink domain. "
        "Unset means the whole world (attention TP 1), the usual choice for MLA models, whose "
        "latent KV would be copied on every TP rank. At most 2048, the largest world (128 nodes x 16 "
        "GPUs).",
    )
    all_to_all_backend: Literal["deepep", "mooncake", "nixl", "flashinfer", "none"] = Field(
        default="deepep",
        description="Kernel library that dispatches tokens to experts and combines the results "
        "(SGLang --moe-a2a-backend). deepep is DeepSeek's RDMA/NVLink all-to-all; none runs the "
        "experts tensor-parallel with no expert parallelism (EP size 1, no expert placement), the "
        "only choice for a single-GPU instance.",
    )
    deepep_mode: Literal["auto", "normal", "low_latency"] = Field(
        default="auto",
        description="DeepEP kernels (SGLang --deepep-mode): normal kernels move large prefill batches at "
        "full bandwidth; low_latency kernels cut per-step latency for small decode batches (CUDA-graph "
        "friendly, at most a few hundred tokens per GPU); auto picks per batch. Only with "
        "allToAllBackend deepep.",
    )
    extra_args: list[Arg] = Field(
        default_factory=list,
        max_length=64,
        description="Extra SGLang arguments for this pool only, after spec.engine.extraArgs (for example "
        "--cuda-graph-max-bs-decode for decode, --chunked-prefill-size for prefill), checked the same "
        "way as spec.engine.extraArgs.",
    )


class PrefillPoolSpec(PoolSpec):
    """Prefill pool of a disaggregated (P/D) deployment: computes prompts, hands their KV to decode."""

    deepep_mode: Literal["auto", "normal", "low_latency"] = Field(
        default="normal",
        description="DeepEP kernels (SGLang --deepep-mode). Prefill batches carry thousands of tokens, "
        "which the normal (high-throughput) kernels suit. Only with allToAllBackend deepep.",
    )


class DecodePoolSpec(PoolSpec):
    """Decode pool: generates tokens; without spec.prefill it also computes prompts."""

    deepep_mode: Literal["auto", "normal", "low_latency"] = Field(
        default="auto",
        description="DeepEP kernels (SGLang --deepep-mode). auto uses the low_latency kernels for "
        "decode batches and normal ones for prefill batches: in a P/D decode pool every batch is a "
        "decode batch, so auto means low_latency there, and it stays correct when this pool serves "
        "alone. Only with allToAllBackend deepep.",
    )


# --------------------------------------------------------------------------- router, transfer


class RouterSpec(APIObject):
    """The SGLang router in front of the pools (PD router when spec.prefill is set)."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Router pods (a Deployment behind one Service). At most 64: every router keeps a "
        "connection to every instance leader and does its own health checks, so more routers add load on "
        "the engines, not capacity.",
    )
    policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = Field(
        default="cache_aware",
        description="How the router picks an instance: cache_aware prefers the instance whose radix "
        "cache already holds the prompt's prefix; power_of_two samples two and takes the less loaded.",
    )
    image: Name | None = Field(default=None, description="Router image; unset uses spec.engine.image.")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port of the router and of its Service.")
    extra_args: list[Arg] = Field(
        default_factory=list,
        max_length=32,
        description="Extra sglang-router 0.3.2 arguments, read as its parser does (unknown and ambiguous "
        "flags, value types and choices are refused). Flags the operator owns, under any spelling "
        "(--pd-disaggregation, --prefill, --decode, --worker-urls, --host, --port, --policy, "
        "--worker-startup-timeout-secs, --health-check-endpoint, --service-discovery*, --*selector, "
        "--prometheus-port, --prometheus-host, --control-plane-api-keys, --mini-lb), are refused.",
    )
    resources: EmbeddedObject | None = Field(
        default=None, description="CPU and memory of the router container (Kubernetes ResourceRequirements)."
    )


class KVTransferSpec(APIObject):
    """How a prompt's KV cache moves from a prefill instance to a decode instance (P/D only)."""

    backend: Literal["mooncake", "nixl"] = Field(
        default="mooncake",
        description="Transfer engine (SGLang --disaggregation-transfer-backend). Ignored without "
        "spec.prefill.",
    )
    ib_devices: list[IBDevice] = Field(
        default_factory=list,
        max_length=16,
        description="RDMA devices to send KV over, such as mlx5_0 (SGLang --disaggregation-ib-device, "
        "joined with commas). Empty lets the transfer engine choose.",
    )
    bootstrap_port: int = Field(
        default=8998,
        ge=1,
        le=65535,
        description="Port where prefill instances accept KV-transfer handshakes (SGLang "
        "--disaggregation-bootstrap-port); the router passes it to decode.",
    )


# --------------------------------------------------------------------------- eplb, monitoring


class EPLBSpec(APIObject):
    """Expert placement: which GPU holds which expert, and how often that changes."""

    model_config = rules(
        cel(
            "!has(self.mode) || !has(self.redundantExperts) || self.mode != 'off' || self.redundantExperts == 0",
            "spec.eplb.redundantExperts needs a placement mode: set spec.eplb.mode to operator, "
            "engine or static, or set redundantExperts to 0",
            ".redundantExperts",
        )
    )

    mode: EplbMode = Field(
        default="operator",
        description="Who decides expert placement. operator: the operator plans from every instance's "
        "load history and the engine applies it online at its next rebalance (no restart). engine: "
        "SGLang's own EPLB per instance; the operator observes, persists and alerts. static: no online "
        "moves; a much better placement is applied by restarting groups one at a time. off: trivial "
        "placement, no EPLB. Pools with EP size 1 have nothing to place and ignore this.",
    )
    redundant_experts: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Extra physical expert slots per MoE layer, holding copies of hot experts (SGLang "
        "--ep-num-redundant-experts). routed experts + redundantExperts must divide evenly by every "
        "pool's EP size: DeepSeek-V3 with 32 gives 288 slots, 4 per GPU at EP72 and 9 at EP32. Each "
        "slot costs one expert's weights per GPU per layer. At most the model's routed experts "
        "(checked at admission) and 1024.",
    )
    refresh_interval: Annotated[Duration, DurationRange("10s", "24h")] = Field(
        default="5m",
        description="How often the operator collects load and considers a new placement, as a duration. "
        "From 10s (each refresh reads every runtime of the pool and plans; a shorter window holds too "
        "few forward passes to plan from) to 24h (a placement never reconsidered stops following "
        "traffic). Production deployments refresh every few minutes.",
    )
    min_improvement: float = Field(
        default=0.03,
        ge=0.0,
        le=1.0,
        description="Smallest predicted gain in balancedness (mean over GPUs of tokens / max, 1.0 = "
        "perfect; absolute difference, so 0.03 = three points) for which a new placement is "
        "published. Smaller gains are not worth moving expert weights.",
    )
    max_moved_experts_per_refresh: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Most physical expert slots, summed over MoE layers, whose expert may change in one "
        "refresh; 0 means no limit. Bounds the weight traffic and stalls of each move. At most "
        "1,000,000, far above any model's slot count (DeepSeek-V3: 58 MoE layers x 288 slots = 16,704).",
    )
    min_interval: Annotated[Duration, DurationRange("10s", "24h")] = Field(
        default="10m",
        description="Shortest time between two published placements, however large the gain; a "
        "rate limit against flapping. From 10s (every placement moves expert weights on every GPU and "
        "stalls the engines while it does) to 24h (longer would pin a placement past a day's traffic "
        "cycle; use mode static or off to stop moving experts).",
    )
    history: Annotated[Duration, DurationRange("1m", "24h")] = Field(
        default="1h",
        description="How much past load the planner weighs. Longer is steadier; shorter follows "
        "traffic shifts (code vs chat) sooner. Must be at least refreshInterval. At most 24h: the "
        "operator keeps the history in memory and in a ConfigMap (bounded in bytes, oldest dropped "
        "first), and yesterday's traffic says little about now.",
    )


# A Kubernetes label value (the API server refuses others on the monitoring objects).
MonitoringLabelValue = Annotated[
    str, StringConstraints(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)
]


class MonitoringSpec(APIObject):
    """Prometheus Operator objects the operator creates for this deployment (docs/alerts.md)."""

    pod_monitor: bool = Field(
        default=True,
        description="Create a PodMonitor (monitoring.coreos.com/v1) scraping every engine pod's SGLang "
        "metrics (port http, spec.engine.port) and the runtime's metrics listener (port metrics, 9402), and "
        "the router's "
        "metrics (port metrics), with the deployment and pool labels the alert rules group by. Skipped "
        "(with an event) while the cluster does not serve the monitoring.coreos.com CRDs.",
    )
    prometheus_rule: bool = Field(
        default=True,
        description="Create a PrometheusRule with the alerts of docs/alerts.md (expert imbalance, load "
        "reporting, rebalancing, availability, latency) for this deployment only: minBalancedness and "
        "alertFor set the expert-imbalance alerts, the others keep the documented thresholds. Skipped "
        "(with an event) while the cluster does not serve the monitoring.coreos.com CRDs. Leave it off "
        "where the cluster-wide rule file already covers the deployment.",
    )
    labels: dict[LabelKey, MonitoringLabelValue] = Field(
        default_factory=dict,
        max_length=16,
        description="Extra labels on the PodMonitor and PrometheusRule, for example the release label "
        "your Prometheus selects them by (podMonitorSelector, ruleSelector). The operator's own labels "
        "win a clash.",
    )
    min_balancedness: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        description="The expert-imbalance alerts (MoEExpertImbalanceHigh, MoEPlacementStaleWhileImbalanced) "
        "fire when a pool's balancedness (mean / max tokens over GPUs, 1.0 = perfect) stays below this "
        "for alertFor. The default is the cluster-wide rule file's.",
    )
    alert_for: Annotated[Duration, DurationRange("1m", "24h")] = Field(
        default="15m",
        description="How long a pool's balancedness must stay below minBalancedness before the "
        "expert-imbalance alerts fire, as a duration. From 1m (shorter fires on one bad scrape or one "
        "rebalance in flight) to 24h (longer is an alert nobody sees).",
    )


# --------------------------------------------------------------------------- the spec


def _pool_rules(pool: str) -> list[dict[str, Any]]:
    guard = f"has(self.{pool}) && " if pool == "prefill" else ""
    world = f"self.{pool}.nodesPerReplica * self.topology.gpusPerNode"
    domain = (
        "(has(self.topology.nvlinkDomainSize) ? self.topology.nvlinkDomainSize : self.topology.gpusPerNode)"
    )
    has_dp = f"has(self.{pool}.attentionDataParallel)"
    return [
        cel(
            f"!({guard}{has_dp}) || ({world}) % self.{pool}.attentionDataParallel == 0",
            f"spec.{pool}.attentionDataParallel must divide the instance's GPU world "
            f"(spec.{pool}.nodesPerReplica x spec.topology.gpusPerNode)",
            f".{pool}.attentionDataParallel",
        ),
        cel(
            f"!({guard}{has_dp}) || ({world}) / self.{pool}.attentionDataParallel <= {domain}",
            f"attention tensor parallelism of spec.{pool} (GPU world / attentionDataParallel) must fit "
            "inside one NVLink domain (spec.topology.nvlinkDomainSize, else gpusPerNode): raise "
            f"spec.{pool}.attentionDataParallel",
            f".{pool}.attentionDataParallel",
        ),
    ]


class MoEDeploymentSpec(APIObject):
    """One Mixture-of-Experts model served with expert parallelism: pools, router and placement."""

    model_config = rules(
        cel(
            "has(self.prefill) == has(oldSelf.prefill)",
            "spec.prefill cannot be added or removed in place: it switches the decode pool between "
            "serving alone and P/D disaggregation; create a new MoEDeployment",
            ".prefill",
        ),
        *_pool_rules("decode"),
        *_pool_rules("prefill"),
    )

    model: ModelSpec = Field(description="The model to serve and where its weights are.")
    engine: EngineSpec = section(EngineSpec, "The SGLang engine container shared by both pools.")
    topology: TopologySpec = section(TopologySpec, "Node shape and placement constraints of the engine pods.")
    prefill: PrefillPoolSpec | None = Field(
        default=None,
        description="Prefill pool. Set it for prefill/decode (P/D) disaggregation: prompts are computed "
        "here and their KV cache is sent to the decode pool, and the router runs in PD mode. Omit it "
        "and the decode pool serves whole requests alone behind a plain router. Cannot be added or "
        "removed after creation.",
    )
    decode: DecodePoolSpec = section(
        DecodePoolSpec,
        "Decode pool: the instances that generate tokens (and, without spec.prefill, also compute "
        "prompts). Its replicas field is the scale subresource, so kubectl scale and "
        "HorizontalPodAutoscalers act on it.",
    )
    router: RouterSpec = section(RouterSpec, "The SGLang router that clients talk to.")
    kv_transfer: KVTransferSpec = section(
        KVTransferSpec, "KV cache transfer from prefill to decode; ignored without spec.prefill."
    )
    eplb: EPLBSpec = section(EPLBSpec, "Expert placement policy (EPLB) for every pool with EP size > 1.")
    monitoring: MonitoringSpec = section(MonitoringSpec, "Prometheus Operator objects and alert knobs.")
