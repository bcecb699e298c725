"""MoEDeployment status: conditions, per-pool instance counts, expert placement.

Written only by the operator. Large or fast-changing data (per-expert load, the placement
map itself) lives in ConfigMaps named here, never in status.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import StatusObject


class Condition(StatusObject):
    """One aspect of the deployment's state (Kubernetes condition conventions)."""

    type: str = Field(max_length=64, description="Condition type: Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(
        default="",
        max_length=128,
        description="CamelCase cause, for example WaitingForCapacity, RollingOut or GroupRestarting.",
    )
    message: str = Field(default="", max_length=4096, description="Human-readable details and what to do.")
    last_transition_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )


class InstanceStart(StatusObject):
    """One instance that is not ready yet."""

    instance: int = Field(ge=0, description="Instance index in its pool.")
    phase: str = Field(
        max_length=32,
        description="launching, distributed_init, loading_weights, kv_cache, cuda_graphs, deepgemm_warmup, "
        'warmup or ready (docs/operator.md, "Start-up").',
    )
    phase_since: str | None = Field(
        default=None,
        description="When the leader's engine entered the phase.",
        json_schema_extra={"format": "date-time"},
    )


class PoolStatus(StatusObject):
    """Instances of one pool as the operator last observed them."""

    desired_replicas: int = Field(default=0, ge=0, description="Instances the spec asks for.")
    replicas: int = Field(
        default=0,
        ge=0,
        description="Instances that exist, in any state (the scale subresource's status.replicas).",
    )
    ready_replicas: int = Field(
        default=0, ge=0, description="Instances whose every rank passes its readiness check."
    )
    updated_replicas: int = Field(default=0, ge=0, description="Instances running the current spec.")
    ready: str = Field(
        default="", max_length=32, description="readyReplicas/desiredReplicas, for kubectl get."
    )
    selector: str = Field(
        default="",
        max_length=1024,
        description="Label selector (string form) of the pool's pods, used by the scale subresource and "
        "HPAs.",
    )
    ep_size: int | None = Field(default=None, ge=1, description="Expert-parallel size of each instance.")
    attention_tensor_parallel: int | None = Field(
        default=None, ge=1, description="Attention tensor-parallel size of each instance."
    )
    group_backend: Literal["StatefulSet", "LeaderWorkerSet"] | None = Field(
        default=None, description="What runs each instance's pod group (spec.topology.groupBackend resolved)."
    )
    group_restarts: int = Field(default=0, ge=0, description="Whole-group restarts since creation.")
    starting: list[InstanceStart] = Field(
        default_factory=list,
        max_length=256,
        description="Instances on their way up, with the start-up phase their leader's engine is in (read "
        "from SGLang's own log by the runtime): a slow start shows as progress here.",
    )
    width_blocked: list[int] = Field(
        default_factory=list,
        max_length=256,
        description="Instances a width change cannot roll yet: their group at the new width would land on "
        "nodes another instance still runs, or the plan has no nodes for them. An autoscaled pool drains "
        "the others first.",
    )
    outdated: list[int] = Field(
        default_factory=list,
        max_length=256,
        description="Instances whose pods run an older pod template than the spec's, at the spec's width (a "
        "spec change other than nodesPerReplica): an autoscaled pool drains each before it rolls.",
    )


class PoolsStatus(StatusObject):
    """Status of each pool."""

    prefill: PoolStatus | None = Field(default=None, description="Prefill pool; absent without spec.prefill.")
    decode: PoolStatus | None = Field(default=None, description="Decode pool.")


class InstancePlacementStatus(StatusObject):
    """The placement one instance of the pool holds (eplb mode operator plans each instance)."""

    name: str = Field(max_length=253, description="The instance's leader pod.")
    version: int = Field(default=0, ge=0, description="Placement version pushed to the instance.")
    measured_balancedness: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Balancedness of the instance's map on its own latest window (2 decimals).",
    )
    predicted_balancedness: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Balancedness the instance's map was predicted to reach when it last changed.",
    )


class PlacementStatus(StatusObject):
    """The expert placement a pool currently runs and how well it balances."""

    version: int = Field(
        default=0, ge=0, description="Version of the published placement; 0 = trivial placement."
    )
    config_map: str | None = Field(
        default=None, max_length=253, description="ConfigMap holding the placement map."
    )
    update_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When this version was published.",
    )
    last_evaluation_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the operator last considered a new placement.",
    )
    measured_balancedness: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Balancedness measured over the latest window: per layer mean over GPUs of tokens / "
        "max over GPUs, averaged over layers (1.0 = perfect); in eplb mode operator the mean over "
        "instances, each on its own latest window.",
    )
    predicted_balancedness: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Balancedness the current placement was predicted to reach, scored on windows "
        "after the ones it was fitted on; in eplb mode operator the mean over instances of the maps "
        "they run after the last evaluation (measured where unchanged).",
    )
    moved_experts: int | None = Field(
        default=None, ge=0, description="Expert slots that changed when this version was published."
    )
    message: str = Field(
        default="",
        max_length=1024,
        description="Why the last evaluation did or did not publish a new placement.",
    )
    instances: list[InstancePlacementStatus] | None = Field(
        default=None,
        max_length=32,
        description="eplb mode operator: each instance's own placement (the first 32 by name); the "
        "pool's fields above are means over them and the ConfigMap holds the map new groups boot with.",
    )


class PlacementsStatus(StatusObject):
    """Expert placement of each pool (pools have different EP sizes, hence different maps)."""

    prefill: PlacementStatus | None = Field(default=None, description="Placement of the prefill pool.")
    decode: PlacementStatus | None = Field(default=None, description="Placement of the decode pool.")


class RouterStatus(StatusObject):
    """The router Deployment."""

    replicas: int = Field(default=0, ge=0, description="Router pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Router pods that are ready.")
    endpoint: str = Field(default="", max_length=1024, description="In-cluster URL clients send requests to.")


class PoolAutoscalingStatus(StatusObject):
    """What the autoscaler decided for one pool, and the numbers behind it (docs/autoscaling.md)."""

    instances: int = Field(
        default=0, ge=0, le=256, description="Instances the pool keeps, booting and draining ones included."
    )
    serving: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Instances the router sends requests to: the first this many, "
        "less rollingInstance during a roll (a width change, or another spec change).",
    )
    need: int = Field(
        default=0,
        ge=0,
        description="Instances the forecast load needs at the SLO, before min, max and budget.",
    )
    reason: str = Field(
        default="",
        max_length=32,
        description="Last decision: steady, scale_out, scale_in, draining, drained, cooldown, booting, "
        "budget, min_instances, rolled_back, no_data, or a width change's width_waiting, width_draining, "
        "width_drained, width_rolling, width_stuck, width_rolled, or the same spec_* words for a roll to a new "
        "pod template at the same width.",
    )
    message: str = Field(default="", max_length=2048, description="The decision in words, with its numbers.")
    offered_rate: float | None = Field(
        default=None, ge=0, description="Requests/s the pool was offered in the last interval."
    )
    forecast_rate: float | None = Field(
        default=None,
        ge=0,
        description="Requests/s planned for: the offered rate, or the lowest recent rate plus "
        "burstReserve times the remembered burst if more, plus (while an SLO is breached) the rate that "
        "drains the queue within one bootTime.",
    )
    rate_per_instance: float | None = Field(
        default=None, ge=0, description="Requests/s one instance takes at the SLO, as the fitted model says."
    )
    latency: dict[str, float] | None = Field(
        default=None,
        description="Measured latency at the SLO's percentile in the last interval, seconds, by target (ttft, itl).",
    )
    token_usage: float | None = Field(
        default=None, ge=0, description="Mean KV-cache use of the serving instances, 0 to 1."
    )
    recommended_nodes_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=128,
        description="A wider instance that would hold the pool's KV cache on fewer GPUs "
        "(autoscaling.nodesPerReplicaOptions), when KV room limits the pool; absent otherwise.",
    )
    last_scale_time: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When instances last changed."
    )
    pending_since: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the current scale-out or drain began (absent when none is under way).",
    )
    blocked_until: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="No growth before this time: a scale-out was rolled back.",
    )
    nodes_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=128,
        description="The width the autoscaler runs the pool at (autoscaling.widthChanges Apply), "
        "while spec.<pool>.nodesPerReplica is still nodesPerReplicaFrom; absent otherwise.",
    )
    width_held: str | None = Field(
        default=None,
        max_length=300,
        description="Why the recommended width is not applied yet (autoscaling.widthChanges Apply): "
        "past spec.gpuBudget, one instance serving, a scale-out, drain or width change under way, or "
        "a spec at that width that admission refuses; absent when nothing waits.",
    )
    width_retry_after: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="No wider width is chosen before this time (autoscaling.widthChanges Apply): the "
        "last one chosen did not come up, and the pool went back to nodesPerReplica.",
    )
    width_failures: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="Chosen widths in a row that did not come up (autoscaling.widthChanges Apply): each "
        "doubles the wait before the next choice (widthRetryAfter); absent once a chosen width ran.",
    )
    nodes_per_replica_from: int | None = Field(
        default=None,
        ge=1,
        le=128,
        description="The spec's nodesPerReplica when the autoscaler chose nodesPerReplica: an edit of "
        "the spec's width ends the autoscaler's choice.",
    )
    rolling_instance: int | None = Field(
        default=None,
        ge=0,
        le=255,
        description="The instance off the router for a roll (a width change, or a new pod template): it "
        "finishes its requests, then the reconciler rolls it; listed again once ready. Absent when none.",
    )
    rolling_released: bool | None = Field(
        default=None,
        description="The rolling instance finished its requests (or the drain timed out): it may roll now.",
    )
    rolling_spec: bool | None = Field(
        default=None,
        description="The rolling instance rolls to a new pod template at its width (a spec change other "
        "than nodesPerReplica), not to a new width.",
    )
    rolling_since: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the rolling instance left the router, or was released to roll.",
    )
    width_waiting_since: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="Since when a roll (a width change, or a spec roll) waits for a listed instance that is "
        "down (absent otherwise).",
    )
    width_waiting_reported: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When that wait was last reported (WidthRollWaiting or SpecRollWaiting, every twice "
        "bootTime).",
    )
    model: str = Field(
        default="",
        max_length=16384,
        description="The autoscaler's fitted model and recent rates (JSON, checked when read back).",
    )


class AutoscalingStatus(StatusObject):
    """The autoscaler's state per pool; absent for pools it does not scale."""

    prefill: PoolAutoscalingStatus | None = Field(default=None, description="Prefill pool.")
    decode: PoolAutoscalingStatus | None = Field(default=None, description="Decode pool.")


class MoEDeploymentStatus(StatusObject):
    """Observed state of an MoEDeployment."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec the operator last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready (all pools serve), Progressing (the operator is still converging; reason "
        "WaitingForCapacity when a group cannot be placed whole) and Degraded (serving, but with "
        "restarting groups, stale placement or high imbalance).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    pools: PoolsStatus | None = Field(default=None, description="Instance counts of each pool.")
    router: RouterStatus | None = Field(default=None, description="Router pods and endpoint.")
    placement: PlacementsStatus | None = Field(default=None, description="Expert placement of each pool.")
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="Autoscaler decisions of the pools it scales (autoscaling.mode Operator)."
    )
