"""The engine config of each pool: the JSON file the runtime's launcher turns into SGLang flags."""

from __future__ import annotations

from typing import Any, Literal

from moe_contract.engine import EngineConfig, EplbMode
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.derived import Pool, pool_layout, pools, resolve_architecture
from moe_operator.recipe import effective_args, pool_context, startup_timeout_s
from moe_operator.recipe.derive import effective_deepep_mode


def role(spec: MoEDeploymentSpec, pool: Pool) -> Literal["prefill", "decode", "standalone"]:
    if spec.prefill is None:
        return "standalone"
    return pool


def model_path(spec: MoEDeploymentSpec) -> str:
    return spec.model.path or spec.model.name


def eplb_mode(spec: MoEDeploymentSpec, pool: Pool) -> EplbMode:
    """EPLB needs expert parallelism: a pool with EP size 1 runs with it off, whatever the spec says."""
    layout = pool_layout(pools(spec)[pool], spec.topology)
    return spec.eplb.mode if layout.ep_size > 1 else "off"


def engine_config(spec: MoEDeploymentSpec, pool: Pool) -> dict[str, Any]:
    """One pool's EngineConfig as JSON-ready dict (validated by the runtime's own model)."""
    p = pools(spec)[pool]
    layout = pool_layout(p, spec.topology)
    arch = resolve_architecture(spec.model)
    mode = eplb_mode(spec, pool)
    # The recipe's flags first, then the user's (which replace any recipe flag of the same dest).
    extra, trust_remote_code, load_format = _lift_runtime_flags(effective_args(spec, pool))
    a2a = p.all_to_all_backend if layout.expert_parallel else "none"
    cfg: dict[str, Any] = {
        "schemaVersion": 1,
        "modelPath": model_path(spec),
        "servedModelName": spec.model.name,
        "role": role(spec, pool),
        "parallel": {
            "nnodes": layout.nodes,
            "gpusPerNode": layout.gpus_per_node,
            "attnDp": layout.attention_dp,
            "a2aBackend": a2a,
            **({"deepepMode": effective_deepep_mode(pool_context(spec, pool))} if a2a == "deepep" else {}),
        },
        "eplb": {
            "mode": mode,
            "numRedundantExperts": spec.eplb.redundant_experts if mode != "off" else 0,
        },
        "disaggregation": {
            "transferBackend": spec.kv_transfer.backend,
            "bootstrapPort": spec.kv_transfer.bootstrap_port,
            "ibDevices": list(spec.kv_transfer.ib_devices) if spec.prefill is not None else [],
        },
        "ports": {"http": spec.engine.port, "distInit": spec.engine.dist_init_port},
        "model": {
            "numLayers": arch.layers,
            "numExperts": arch.routed_experts,
            "topK": arch.experts_per_token,
            "numGroups": arch.expert_groups,
        }
        if arch is not None
        else {},
        "trustRemoteCode": trust_remote_code,
        "kvCacheDtype": spec.model.kv_cache_dtype,
        **({"loadFormat": load_format} if load_format else {}),
        "extraArgs": extra,
        "drainSeconds": DRAIN_SECONDS,
        "graceSeconds": grace_seconds(spec),
    }
    # The runtime's model is the contract: refuse here what the launcher would refuse in the pod.
    return EngineConfig.model_validate(cfg).model_dump(mode="json", by_alias=True, exclude_none=True)


DRAIN_SECONDS = 5.0
"""Not-ready time before SIGTERM reaches SGLang: routers stop sending first."""


def grace_seconds(spec: MoEDeploymentSpec) -> float:
    """The launcher's SIGTERM-to-SIGKILL for the engine: a tenth of the start-up allowance, 30 s to
    180 s (SGLang drains its requests, then gives its processes 15 s and waits at most 60 s more)."""
    return min(max(startup_timeout_s(spec) / 10, 30.0), 180.0)


def _lift_runtime_flags(args: list[str]) -> tuple[list[str], bool, str | None]:
    """Flags users may pass but the launcher owns become config fields, not raw arguments."""
    out: list[str] = []
    trust, load_format = False, None
    it = iter(args)
    for arg in it:
        if arg == "--trust-remote-code":
            trust = True
        elif arg == "--load-format":
            load_format = next(it, None)
        elif arg.startswith("--load-format="):
            load_format = arg.split("=", 1)[1]
        else:
            out.append(arg)
    return out, trust, load_format
