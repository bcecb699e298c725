"""The engine config: one JSON document per pool that the operator renders into a ConfigMap and
the runtime's launcher turns into SGLang flags (mounted at ``/etc/moe/engine/engine.json``).

Its validation refuses configurations SGLang would reject or that cannot run on the pod
group, with a message naming the field to change, so the operator refuses them at
render time and the runtime refuses them in the pod with the same words.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from .flags import engine_catalog, resolve
from .pod import DEFAULT_PLACEMENT_PATH, SIDECAR_PORT

Role = Literal["prefill", "decode", "standalone"]
A2ABackend = Literal["deepep", "none", "mooncake", "nixl", "mori", "flashinfer", "deepep_v2", "pplx"]
DeepEPMode = Literal["auto", "normal", "low_latency"]
KVCacheDtype = Literal["auto", "bf16", "fp8_e4m3", "fp8_e5m2"]  # spec.model.kvCacheDtype; SGLang's choices
EplbMode = Literal["operator", "engine", "static", "off"]  # spec.eplb.mode, one name everywhere
DispatchAlgorithm = Literal["static", "dynamic", "fake", "lp"]
TransferBackend = Literal["mooncake", "nixl", "mori", "mooncake_tcp", "fake"]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, protected_namespaces=()
    )


class ModelFacts(_Model):
    """Facts of the served model the operator knows from its catalog (optional; used for checks)."""

    num_layers: int | None = Field(default=None, ge=1, description="num_hidden_layers, dense layers included")
    num_experts: int | None = Field(default=None, ge=1, description="routed (logical) experts per MoE layer")
    top_k: int | None = Field(default=None, ge=1, description="experts per token")
    num_groups: int | None = Field(default=None, ge=1, description="expert groups (DeepSeek n_group)")


class Parallelism(_Model):
    nnodes: int = Field(default=1, ge=1, description="pods (nodes) in one engine instance")
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    tp: int | None = Field(
        default=None, ge=1, description="tensor-parallel world; default nnodes * gpusPerNode"
    )
    attn_dp: int = Field(default=1, ge=1, description="attention data-parallel width (--attn-dp-size)")
    ep: int | None = Field(
        default=None, ge=1, description="expert-parallel size; default tp with an a2a backend"
    )
    a2a_backend: A2ABackend = Field(default="deepep", alias="a2aBackend", description="--moe-a2a-backend")
    deepep_mode: DeepEPMode | None = Field(
        default=None, description="default by role: normal / low_latency / auto"
    )
    deepep_config: str | None = None

    @property
    def world(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def tp_size(self) -> int:
        return self.tp if self.tp is not None else self.world

    @property
    def ep_size(self) -> int:
        if self.ep is not None:
            return self.ep
        return self.tp_size if self.a2a_backend != "none" else 1


class Eplb(_Model):
    mode: EplbMode = "operator"
    num_redundant_experts: int = Field(default=0, ge=0)
    rebalance_iterations: int = Field(default=1000, ge=1, description="forward passes between rebalances")
    rebalance_layers_per_chunk: int | None = Field(default=None, ge=1)
    algorithm: str | None = Field(default=None, description="SGLang --eplb-algorithm for its own fallback")
    dispatch_algorithm: DispatchAlgorithm | None = None
    placement_file: str | None = Field(
        default=DEFAULT_PLACEMENT_PATH, description="mounted placement ConfigMap"
    )
    placement_max_age_seconds: float = Field(default=1800.0, gt=0)


class Disaggregation(_Model):
    transfer_backend: TransferBackend = "mooncake"
    bootstrap_port: int = Field(default=8998, ge=1, le=65535)
    ib_devices: list[str] = Field(default_factory=list)


class Ports(_Model):
    http: int = Field(default=30000, ge=1, le=65535)
    dist_init: int = Field(default=20102, ge=1, le=65535)
    sidecar: int = Field(default=SIDECAR_PORT, ge=1, le=65535)


class EngineConfig(_Model):
    """One pool's engine settings (JSON, camelCase keys), mounted into every pod of the pool."""

    schema_version: Literal[1] = 1
    model_path: str = Field(min_length=1)
    served_model_name: str | None = None
    role: Role = "standalone"
    parallel: Parallelism = Field(default_factory=Parallelism)
    eplb: Eplb = Field(default_factory=Eplb)
    disaggregation: Disaggregation = Field(default_factory=Disaggregation)
    ports: Ports = Field(default_factory=Ports)
    model: ModelFacts = Field(default_factory=ModelFacts)
    host: str = "0.0.0.0"
    load_format: str | None = None
    kv_cache_dtype: KVCacheDtype = Field(
        default="auto", description="--kv-cache-dtype (auto: the activations')"
    )
    trust_remote_code: bool = False
    enable_metrics: bool = True
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the engine")
    drain_seconds: float = Field(
        default=5.0, ge=0, description="not-ready time before SIGTERM reaches SGLang"
    )
    grace_seconds: float = Field(default=60.0, gt=0, description="SIGTERM -> SIGKILL for the engine")

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        problems = config_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def deepep_mode(self) -> DeepEPMode:
        if self.parallel.deepep_mode is not None:
            return self.parallel.deepep_mode
        return {"prefill": "normal", "decode": "low_latency", "standalone": "auto"}[self.role]  # type: ignore[return-value]

    @property
    def eplb_enabled(self) -> bool:
        """SGLang's online EPLB runs (and calls the plugin) in operator and engine modes."""
        return self.eplb.mode in ("operator", "engine")

    @property
    def dispatch(self) -> Literal["static", "dynamic"]:
        """The dispatch rule SGLang resolves to (static with an a2a backend, else dynamic)."""
        chosen = self.eplb.dispatch_algorithm
        if chosen in ("static", "dynamic"):
            return chosen
        return "static" if self.parallel.a2a_backend != "none" else "dynamic"


def config_problems(cfg: EngineConfig) -> list[str]:
    """Everything that makes a config impossible, as messages naming fields (camelCase)."""
    p = cfg.parallel
    out: list[str] = []
    tp, ep = p.tp_size, p.ep_size
    if tp != p.world:
        out.append(
            f"parallel.tp={tp} must equal nnodes*gpusPerNode={p.world}: every pod of an instance "
            "runs one engine rank per GPU"
        )
    if tp % p.attn_dp:
        out.append(f"parallel.attnDp={p.attn_dp} must divide tp={tp}")
    if p.a2a_backend != "none" and ep != tp:
        out.append(
            f"parallel.ep={ep} must equal tp={tp} with a2aBackend={p.a2a_backend} "
            "(SGLang forces ep_size = tp_size)"
        )
    if p.a2a_backend == "none" and tp % ep:
        out.append(f"parallel.ep={ep} must divide tp={tp}")
    if p.a2a_backend in ("deepep", "deepep_v2") and p.nnodes == 1 and tp not in (2, 4, 8):
        out.append(f"DeepEP intranode kernels support 2, 4 or 8 ranks, not tp={tp}")
    if cfg.role == "prefill" and p.deepep_mode == "low_latency":
        out.append(
            "parallel.deepepMode=low_latency cannot serve prefill (extend) batches; use normal or auto"
        )
    if cfg.eplb_enabled and ep <= 1:
        out.append(f"eplb.mode={cfg.eplb.mode} needs expert parallelism (ep > 1, got {ep}); use mode off")
    facts = cfg.model
    if facts.num_experts is not None:
        physical = facts.num_experts + cfg.eplb.num_redundant_experts
        if physical % ep:
            out.append(
                f"experts + eplb.numRedundantExperts = {facts.num_experts} + "
                f"{cfg.eplb.num_redundant_experts} = {physical} must be a multiple of ep={ep}"
            )
    if cfg.eplb.num_redundant_experts and ep <= 1:
        out.append("eplb.numRedundantExperts > 0 needs ep > 1")
    if cfg.role == "standalone" and cfg.disaggregation.ib_devices:
        out.append("disaggregation.ibDevices is set but role is standalone (no KV transfer)")
    clash = sorted(managed_flags_in(cfg.extra_args))
    if clash:
        out.append(f"extraArgs must not set flags the launcher manages: {', '.join(clash)}")
    return out


# Flags the launcher derives from fields (canonical names of the engine's flag catalog,
# moe_contract/catalogs); extraArgs may not set them under any spelling SGLang accepts: an alias
# (--tensor-parallel-size, --ep) or an unambiguous prefix (--tp) reaches the same argparse dest.
# The operator's admission refuses the same dests (moe_operator.validation.flags), except
# --trust-remote-code and --load-format, which it moves from extraArgs into their fields.
# --eplb-algorithm is the user's (no spec field): admission checks the name instead.
MANAGED_FLAGS = frozenset(
    {
        "--model-path",
        "--served-model-name",
        "--host",
        "--port",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--tp-size",
        "--attn-dp-size",
        "--dp-size",
        "--enable-dp-attention",
        "--ep-size",
        "--moe-a2a-backend",
        "--deepep-mode",
        "--deepep-config",
        "--disaggregation-mode",
        "--disaggregation-bootstrap-port",
        "--disaggregation-transfer-backend",
        "--disaggregation-ib-device",
        "--enable-eplb",
        "--ep-num-redundant-experts",
        "--eplb-rebalance-num-iterations",
        "--eplb-rebalance-layers-per-chunk",
        "--ep-dispatch-algorithm",
        "--init-expert-location",
        "--expert-distribution-recorder-mode",
        "--enable-metrics",
        "--expert-balancedness-report-mode",
        "--kv-cache-dtype",
        "--load-format",
        "--trust-remote-code",
    }
)


def managed_flags_in(args: list[str]) -> set[str]:
    """The managed flags ``args`` set, as written (and the flag meant, for an alias or a prefix)."""
    catalog = engine_catalog()
    dests = {catalog.flag(f).dest for f in MANAGED_FLAGS}
    resolution = resolve(catalog, args)
    found = [(occ.written, occ.flag) for occ in resolution.occurrences]
    # A managed flag with a bad value is still a managed flag (a stray value names the flag before it).
    found += [
        (e.token.split("=", 1)[0], e.flag) for e in resolution.errors if e.flag and e.kind != "stray_value"
    ]
    return {
        written if written == flag.name else f"{written} ({flag.name})"
        for written, flag in found
        if flag.dest in dests
    }
