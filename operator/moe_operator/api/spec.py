"""MoEDeployment spec: the one source of the CRD's spec schema, its defaults and CEL rules.

Descriptions are what `kubectl explain` shows: each says what the field does, in which
unit, and why a value matters. The generator appends allowed values, bounds and
defaults, so the prose does not repeat them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from moe_contract.engine import EplbMode

from .base import APIObject, cel, rules, section
from .fields import Arg, IBDevice, Name
from .model_spec import ModelSpec
from .topology_spec import TopologySpec
from .types import Duration, DurationRange, EmbeddedObject, LabelKey, Quantity

DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"
ROUTER_METRICS_PORT = 29000  # the router's --prometheus-port, set by the operator


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
    recipe_exclude: list[
        Annotated[
            str, StringConstraints(pattern=r"^(--[a-z0-9][a-z0-9-]*|[A-Z_][A-Z0-9_]*)$", max_length=128)
        ]
    ] = Field(
        default_factory=list,
        max_length=32,
        description="Settings the operator's recipe derives that this deployment leaves out, by flag "
        "(--enable-two-batch-overlap) or environment variable name (NCCL_SOCKET_IFNAME): the way to "
        "turn off a derived switch, which extraArgs cannot (SGLang has no --no- form for it). "
        "`moe-operator render --explain` lists what the recipe derives; docs/recipes.md explains each.",
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
        "wide-EP deployments allow 45 to 100 minutes), 45m for one with kernelCacheClaim, else 30m. From 1m (no engine loads its weights "
        "and initialises faster, so less would restart every group in a loop) to 4h (a hung group "
        "holds whole GPU nodes that long).",
    )


# --------------------------------------------------------------------------- autoscaling


class LatencyTargets(APIObject):
    """The service levels a pool is scaled to, as SGLang measures them on its servers."""

    model_config = rules(
        cel(
            "has(self.ttft) || has(self.itl)",
            "autoscaling.slo needs a target: set ttft (time to first token) or itl (inter-token latency)",
        )
    )

    ttft: Annotated[Duration, DurationRange("10ms", "10m")] | None = Field(
        default=None,
        description="Time to first token at the percentile (SGLang's time_to_first_token_seconds, "
        "observed on decode and standalone servers). The prefill pool of a P/D deployment is scaled "
        "on it, measured at the decode pool; a standalone decode pool on it and on itl.",
    )
    itl: Annotated[Duration, DurationRange("1ms", "10s")] | None = Field(
        default=None,
        description="Inter-token latency at the percentile (SGLang's inter_token_latency_seconds). "
        "The decode pool's target; a prefill pool generates no tokens and refuses it.",
    )
    percentile: int = Field(
        default=90,
        ge=50,
        le=99,
        description="Which percentile of the interval's latency must stay inside the targets, 50 "
        "to 99 (higher percentiles need more of the interval's requests to be estimated).",
    )


MAX_DRAIN_TIMEOUT = "2h"  # autoscaling.drainTimeout's maximum (admission's drain warning reads it too)


class PoolAutoscalingSpec(APIObject):
    """The operator sizes the pool to its SLO, whole instances at a time (docs/autoscaling.md)."""

    model_config = rules(
        cel(
            "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            "autoscaling.minReplicas must not exceed maxReplicas",
            ".minReplicas",
        ),
        cel(
            "!has(self.mode) || self.mode != 'Operator' || has(self.slo)",
            "autoscaling.mode Operator needs autoscaling.slo: the targets the pool is sized to",
            ".slo",
        ),
    )

    mode: Literal["Operator", "External"] = Field(
        default="Operator",
        description="Operator: the operator decides the pool's instances from its SGLang metrics "
        "and spec.<pool>.replicas is only the starting size. External: replicas is the size, "
        "left to people, a HorizontalPodAutoscaler or KEDA (the decode pool's replicas is the "
        "scale subresource); the rest of this section is ignored.",
    )
    min_replicas: int = Field(
        default=1, ge=1, le=256, description="Fewest instances, whatever the load (at least 1)."
    )
    max_replicas: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Most instances. With spec.gpuBudget, the deployment's GPUs also bound growth.",
    )
    slo: LatencyTargets | None = Field(default=None, description="The latency targets the pool is sized to.")
    boot_time: Annotated[Duration, DurationRange("30s", "2h")] = Field(
        default="10m",
        description="How long a new instance takes from creation to serving (image pull, weight "
        "load, kernel warm-up). The autoscaler keeps capacity for the load that can arrive in "
        "that time, and gives up on a scale-out whose instances are not ready after twice this.",
    )
    scale_out_cooldown: Annotated[Duration, DurationRange("10s", "1h")] = Field(
        default="1m", description="Shortest time between two scale-outs of the pool."
    )
    scale_in_cooldown: Annotated[Duration, DurationRange("30s", "24h")] = Field(
        default="2m",
        description="Shortest time after any change before an instance is removed; removals are one "
        "instance at a time.",
    )
    scale_in_window: Annotated[Duration, DurationRange("1m", "1h")] = Field(
        default="10m",
        description="Scale-in sizes the pool for the highest load of this window, so a dip shorter "
        "than it removes nothing.",
    )
    drain_timeout: Annotated[Duration, DurationRange("10s", MAX_DRAIN_TIMEOUT)] = Field(
        default="10m",
        description="How long an instance being removed may take to finish its requests after the "
        "router stops sending it new ones; after it the instance goes with what it still runs.",
    )
    target_utilization: int = Field(
        default=90,
        ge=50,
        le=100,
        description="Percent of the rate an instance can take at the SLO that the pool is planned "
        "to: lower keeps more headroom against noise, and against bursts in proportion to the load "
        "(in benchmarks/autoscale_bench.py, with a 5-minute bootTime and bursts that rise faster, "
        "70 with burstReserve 50 met the SLO where the defaults did not; on smooth load it costs "
        "about a third more GPU-hours).",
    )
    nodes_per_replica_options: list[Annotated[int, Field(ge=1, le=128)]] = Field(
        default_factory=list,
        max_length=8,
        description="Other instance widths (nodesPerReplica) to weigh when KV-cache room, not compute, "
        "limits the pool: a wider instance holds fewer expert weights per GPU, so more KV. The "
        "autoscaler recommends the width that holds the pool's tokens on the fewest GPUs in "
        "status.autoscaling.<pool>.recommendedNodesPerReplica and an event; with widthChanges "
        "Apply it also runs the pool at that width.",
    )
    width_changes: Literal["Recommend", "Apply"] = Field(
        default="Recommend",
        description="Recommend: a better width is only reported (status and an event); a person or a "
        "pipeline sets nodesPerReplica. Apply: the autoscaler also runs the pool at a wider width it "
        "recommends (status.autoscaling.<pool>.nodesPerReplica) once two or more instances serve and "
        "the pool at that width fits spec.gpuBudget, each instance replaced make-before-break, while "
        "spec.<pool>.nodesPerReplica stays what was written (editing it takes over again).",
    )
    burst_memory: Annotated[Duration, DurationRange("1m", "168h")] = Field(
        default="6h",
        description="Half-life of the remembered largest rise of load within one bootTime, for "
        "which the pool keeps spare capacity (burstReserve). Longer meets the SLO through more "
        "bursts and costs more GPU-hours (benchmarks/autoscale_bench.py measures the trade).",
    )
    burst_reserve: int = Field(
        default=100,
        ge=0,
        le=400,
        description="Spare capacity kept for a burst, in percent of the largest rise of load within "
        "one bootTime the pool remembers (burstMemory): 100 holds a burst as large as that one, 150 "
        "one half as large again (a burst that lands on a higher load rises more), 0 none. Higher "
        "meets the SLO through more bursts and costs more GPU-hours "
        "(benchmarks/autoscale_bench.py measures the trade).",
    )


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
    autoscaling: PoolAutoscalingSpec | None = Field(
        default=None,
        description="Scale the pool to an SLO (mode Operator) or leave its size to replicas (mode "
        "External, the default without this section). docs/autoscaling.md.",
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
        "moves; a much better placement is applied by restarting groups one at a time, and the next "
        "only once every group runs it. off: trivial "
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
    # Without gpusPerNode (spec.topology.hardware supplies it) the webhook's rules check this instead.
    guard = "has(self.topology.gpusPerNode) && " + (f"has(self.{pool}) && " if pool == "prefill" else "")
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
    gpu_budget: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Most GPUs the engine pools may hold together while the operator scales them "
        "(pools with autoscaling.mode Operator grow only inside it; it never forces a pool to "
        "shrink). Unset: each pool's maxReplicas is its only bound.",
    )
