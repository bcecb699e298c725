"""A pool's autoscaling policy from the spec: the knobs as numbers the decision reads."""

from __future__ import annotations

from ..api.derived import Pool, pools, world_size
from ..api.spec import MoEDeploymentSpec, PoolAutoscalingSpec
from ..api.types import parse_duration
from ..validation.memory_rules import kv_tokens_at_width
from .decide import Objective, PoolPolicy, Width


def scaled_pools(spec: MoEDeploymentSpec) -> dict[Pool, PoolAutoscalingSpec]:
    """The pools the operator sizes (autoscaling.mode Operator), prefill first."""
    return {
        name: p.autoscaling
        for name, p in pools(spec).items()
        if p.autoscaling is not None and p.autoscaling.mode == "Operator"
    }


def objectives(a: PoolAutoscalingSpec) -> tuple[Objective, ...]:
    if a.slo is None:
        return ()
    q = a.slo.percentile / 100
    out = []
    if a.slo.ttft is not None:
        out.append(Objective("ttft", parse_duration(a.slo.ttft), q))
    if a.slo.itl is not None:
        out.append(Objective("itl", parse_duration(a.slo.itl), q))
    return tuple(out)


def pool_policy(spec: MoEDeploymentSpec, pool: Pool) -> PoolPolicy:
    p = pools(spec)[pool]
    a = p.autoscaling
    assert a is not None
    gpus = world_size(p, spec.topology)
    per_node = spec.topology.gpus_per_node
    kv_now = kv_tokens_at_width(spec, pool, p.nodes_per_replica)
    width = Width(nodes=p.nodes_per_replica, gpus=gpus, kv_tokens=kv_now)
    options = sorted(set(a.nodes_per_replica_options) - {p.nodes_per_replica})
    others = [Width(n, n * per_node, kv_tokens_at_width(spec, pool, n)) for n in options]
    widths = tuple(w for w in (width, *others) if w.kv_tokens > 0) if others and kv_now > 0 else ()
    return PoolPolicy(
        objectives=objectives(a),
        min_instances=a.min_replicas,
        max_instances=a.max_replicas,
        width=width,
        widths=widths,
        headroom=a.target_utilization / 100,
        scale_out_cooldown_s=parse_duration(a.scale_out_cooldown),
        scale_in_cooldown_s=parse_duration(a.scale_in_cooldown),
        scale_in_window_s=parse_duration(a.scale_in_window),
        boot_s=parse_duration(a.boot_time),
        drain_timeout_s=parse_duration(a.drain_timeout),
        surge_half_life_s=parse_duration(a.burst_memory),
        burst_reserve=a.burst_reserve / 100,
    )
