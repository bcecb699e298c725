"""Rules tying fields together: ports, placement timing."""

from __future__ import annotations

from moe_contract import pod as P

from ..api.spec import ROUTER_METRICS_PORT, MoEDeploymentSpec
from ..api.types import parse_duration
from .problem import Problem


def check_ports(spec: MoEDeploymentSpec) -> list[Problem]:
    """Engine HTTP, rendezvous and KV bootstrap ports share each pod and must differ."""
    engine = spec.engine
    problems: list[Problem] = []
    if engine.port == engine.dist_init_port:
        problems.append(
            Problem(
                "spec.engine.distInitPort",
                f"spec.engine.distInitPort ({engine.dist_init_port}) equals spec.engine.port; both listen "
                "on the "
                "leader pod: choose another port, such as 20102",
            )
        )
    runtime = {P.SIDECAR_PORT: "API", P.PROBE_PORT: "probe", P.METRICS_PORT: "metrics"}
    engine_ports = [("spec.engine.port", engine.port), ("spec.engine.distInitPort", engine.dist_init_port)]
    if spec.prefill is not None:
        engine_ports.append(("spec.kvTransfer.bootstrapPort", spec.kv_transfer.bootstrap_port))
    for field, port in engine_ports:
        if port in runtime:
            problems.append(
                Problem(
                    field,
                    f"{field} ({port}) is the runtime's {runtime[port]} port in every engine pod "
                    f"({', '.join(str(p) for p in runtime)} are taken); choose another port",
                )
            )
    if spec.router.port == ROUTER_METRICS_PORT:
        problems.append(
            Problem(
                "spec.router.port",
                f"spec.router.port ({ROUTER_METRICS_PORT}) is the router's metrics port; choose another, "
                "such as 8000",
            )
        )
    if spec.prefill is not None and spec.kv_transfer.bootstrap_port in (engine.port, engine.dist_init_port):
        problems.append(
            Problem(
                "spec.kvTransfer.bootstrapPort",
                f"spec.kvTransfer.bootstrapPort ({spec.kv_transfer.bootstrap_port}) collides with "
                "spec.engine.port or distInitPort on the prefill pods; choose another port, such as 8998",
            )
        )
    return problems


def check_eplb(spec: MoEDeploymentSpec) -> list[Problem]:
    """Redundant slots need a placement mode; the load history covers at least one refresh."""
    eplb = spec.eplb
    problems: list[Problem] = []
    if eplb.mode == "off" and eplb.redundant_experts:
        problems.append(
            Problem(
                "spec.eplb.redundantExperts",
                f"spec.eplb.redundantExperts is {eplb.redundant_experts} but spec.eplb.mode is off, so the "
                "copies "
                "would never follow the load; set spec.eplb.mode to operator (or engine, static), or set "
                "redundantExperts to 0",
            )
        )
    if parse_duration(eplb.history) < parse_duration(eplb.refresh_interval):
        problems.append(
            Problem(
                "spec.eplb.history",
                f"spec.eplb.history ({eplb.history}) is shorter than spec.eplb.refreshInterval "
                f"({eplb.refresh_interval}), so each plan would see less than one refresh of load; set "
                "history "
                f"to at least {eplb.refresh_interval}",
            )
        )
    return problems
