"""One hardware profile: accelerator, node and fabric facts a recipe reads (pure data)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

Fabric = Literal["infiniband", "roce", "nvlink"]
Fraction = Annotated[float, Field(gt=0, lt=1)]
RESERVED_ENV_PREFIXES = ("MOE_", "LWS_")
RESERVED_ENV = frozenset(
    {
        "PYTHONPATH",
        "POD_IP",
        "POD_NAME",
        "KERNEL_CACHE_NODE",
        "SGLANG_CACHE_DIR",
        "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
        "SGLANG_HOST_IP",
        "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR",
    }
)
"""Names the operator, the runtime or the recipe set themselves: a profile may not set them too."""


class _Data(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class EnvVar(_Data):
    """An environment variable every engine of the profile gets, with where its value comes from."""

    name: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$", max_length=128)
    value: str = Field(max_length=1024)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            raise ValueError(f"{name} is set by the operator, the runtime or the recipe, not by a profile")
        return name

    source: str = Field(min_length=1, description="public reference or code the value comes from")
    deepep_modes: tuple[Literal["normal", "low_latency", "auto"], ...] = Field(
        default=(), description="only for pools in these DeepEP modes (empty: every pool)"
    )


class HardwareProfile(_Data):
    """A node type and its fabric. Every field a recipe rule reads states its source in ``sources``."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    description: str
    gpu_product: str = Field(description="the node's nvidia.com/gpu.product label (GPU feature discovery)")
    gpus_per_node: int = Field(ge=1, le=16)
    gpu_memory: str = Field(description="memory of one GPU as a Kubernetes quantity")
    nvlink_domain_size: int = Field(ge=1, le=1024, description="GPUs joined by NVLink")
    fabric: Fabric = Field(description="what carries expert-parallel traffic between NVLink domains")
    rdma_resource_name: str | None = Field(default=None, description="extended resource of the RDMA NICs")
    host_network: bool = False
    compute_domain: bool = Field(
        default=False, description="NVLink across nodes needs an IMEX channel (DRA ComputeDomain claim)"
    )
    two_batch_overlap: bool = Field(
        default=False, description="overlap the all-to-all with compute (worth it when it leaves NVLink)"
    )
    deepep_normal_max_ep: int | None = Field(
        default=None, ge=1, description="widest EP DeepEP's normal kernels run at here (None: no limit)"
    )
    batch_per_rank: int = Field(ge=1, le=1024, description="running requests per attention-DP rank")
    mem_fraction_static: dict[Literal["prefill", "decode", "standalone"], Fraction] = Field(
        description="--mem-fraction-static per pool role (prefill, decode, standalone: all three)"
    )
    shared_memory: str = Field(default="64Gi", description="/dev/shm of each engine pod")
    env: tuple[EnvVar, ...] = ()
    sources: dict[str, str] = Field(default_factory=dict, description="field -> public source")

    @field_validator("mem_fraction_static")
    @classmethod
    def _every_role(cls, value: dict[str, float]) -> dict[str, float]:
        missing = {"prefill", "decode", "standalone"} - set(value)
        if missing:
            raise ValueError(f"memFractionStatic needs every role: {', '.join(sorted(missing))} missing")
        return value

    def source(self, field: str) -> str:
        return self.sources.get(field, f"hardware profile {self.name}")
