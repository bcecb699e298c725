"""Rules about autoscaling: each pool scales on a latency its servers can measure, inside bounds.

The CRD's CEL rules say the first three too (the apiserver refuses them with the webhook
down); these say them with the field to change, for the webhook, the CLI and tests.
"""

from __future__ import annotations

from ..api.derived import pools, world_size
from ..api.spec import MAX_DRAIN_TIMEOUT, MoEDeploymentSpec
from ..api.types import parse_duration
from .flags import ROUTER_PRESTOP_S, router_shutdown_grace_s
from .problem import Problem

MAX_DRAIN_TIMEOUT_S = round(parse_duration(MAX_DRAIN_TIMEOUT))


def check_autoscaling(spec: MoEDeploymentSpec) -> list[Problem]:
    problems: list[Problem] = []
    scaled = {n: p for n, p in pools(spec).items() if p.autoscaling and p.autoscaling.mode == "Operator"}
    for name, pool in pools(spec).items():
        a = pool.autoscaling
        if a is None:
            continue
        where = f"spec.{name}.autoscaling"
        if a.min_replicas > a.max_replicas:
            problems.append(
                Problem(
                    f"{where}.minReplicas",
                    f"{where}.minReplicas ({a.min_replicas}) must not exceed maxReplicas ({a.max_replicas})",
                )
            )
        if a.mode != "Operator":
            continue
        if a.slo is None or (a.slo.ttft is None and a.slo.itl is None):
            problems.append(
                Problem(
                    f"{where}.slo",
                    f"{where} with mode Operator needs slo.ttft or slo.itl: the latency the pool is sized to",
                )
            )
            continue
        if name == "prefill" and a.slo.itl is not None:
            problems.append(
                Problem(
                    f"{where}.slo.itl",
                    f"{where}.slo.itl: a prefill pool generates no tokens; scale it on slo.ttft and "
                    "set the inter-token latency on spec.decode.autoscaling.slo.itl",
                )
            )
        if name == "prefill" and a.slo.ttft is None:
            problems.append(
                Problem(
                    f"{where}.slo.ttft",
                    f"{where}.slo.ttft: a prefill pool is scaled on time to first token; set it",
                )
            )
        if name == "decode" and spec.prefill is not None and a.slo.ttft is not None:
            problems.append(
                Problem(
                    f"{where}.slo.ttft",
                    f"{where}.slo.ttft: with spec.prefill, time to first token is the prefill pool's "
                    "doing; move it to spec.prefill.autoscaling.slo.ttft",
                )
            )
        if name == "decode" and spec.prefill is not None and a.slo.itl is None:
            problems.append(
                Problem(
                    f"{where}.slo.itl",
                    f"{where}.slo.itl: a P/D decode pool is scaled on inter-token latency; set it",
                )
            )
    if spec.gpu_budget is not None and scaled:
        held = sum(
            (p.autoscaling.min_replicas if name in scaled and p.autoscaling else p.replicas)
            * world_size(p, spec.topology)
            for name, p in pools(spec).items()
        )
        if held > spec.gpu_budget:
            problems.append(
                Problem(
                    "spec.gpuBudget",
                    f"spec.gpuBudget ({spec.gpu_budget}) is below the {held} GPUs the pools hold at their "
                    "smallest (autoscaled pools' minReplicas, the others' replicas); raise it or lower those",
                )
            )
    return problems


def autoscaling_warnings(spec: MoEDeploymentSpec) -> list[str]:
    """What admits but cuts requests: a drainTimeout shorter than a replaced router pod may still be
    finishing requests at the instance being removed (its pre-stop wait plus its shutdown grace).
    A scale-in or a roll lists the instance off the router, which rolls; the drain ends when no
    replaced router pod runs and the instance is idle, or at drainTimeout, cutting what it still runs."""
    if spec.router.replicas == 0:
        return []
    grace = ROUTER_PRESTOP_S + router_shutdown_grace_s(spec.router.extra_args)
    fix = (
        f"set drainTimeout to {grace}s or more, or lower the router's shutdown grace"
        if grace <= MAX_DRAIN_TIMEOUT_S
        else f"lower the router's shutdown grace to {MAX_DRAIN_TIMEOUT_S - ROUTER_PRESTOP_S}s or less"
    )
    out: list[str] = []
    for name, pool in pools(spec).items():
        a = pool.autoscaling
        if a is None or a.mode != "Operator" or parse_duration(a.drain_timeout) >= grace:
            continue
        out.append(
            f"spec.{name}.autoscaling.drainTimeout ({a.drain_timeout}) is shorter than a replaced router "
            f"pod may keep finishing requests ({grace}s: its {ROUTER_PRESTOP_S}s pre-stop wait and the router's "
            "--shutdown-grace-period-secs): a drain that times out removes the instance with those requests "
            f"in flight; {fix}"
        )
    return out
