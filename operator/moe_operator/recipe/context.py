"""What the recipe rules read about one pool: role, layout, model facts and hardware profile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..api import MoEDeploymentSpec
from ..api.derived import Pool, pool_layout, pools, resolve_architecture, weight_dtype
from ..capacity.layout import InstanceLayout
from ..hardware import HardwareProfile, lookup_profile
from ..models.architecture import MoEArchitecture

Role = Literal["prefill", "decode", "standalone"]


@dataclass(frozen=True)
class PoolContext:
    pool: Pool
    role: Role
    layout: InstanceLayout
    arch: MoEArchitecture | None
    fp8: bool  # served weights are FP8
    profile: HardwareProfile | None
    a2a: str  # all-to-all backend, "none" without expert parallelism
    deepep_mode: str  # as the pool asks ("auto", "normal", "low_latency")
    kv_backend: str | None  # KV transfer backend in P/D, else None
    rdma: bool  # the pods get RDMA NICs (spec.topology.rdmaResourceName, or the profile's)
    user_cap: int | str | None  # the spec's dispatch cap: its literal value, "ref" (valueFrom), or None

    @property
    def deepep(self) -> bool:
        return self.a2a == "deepep"

    @property
    def multi_node(self) -> bool:
        return self.layout.nodes > 1

    @property
    def wide(self) -> bool:
        """Wide expert parallelism over DeepEP with attention data parallelism: the references' shape."""
        return self.deepep and self.layout.ep_size > 1 and self.layout.attention_dp > 1

    @property
    def low_latency(self) -> bool:
        """DeepEP's low-latency kernels run (and cap the tokens one rank dispatches)."""
        return self.deepep and self.deepep_mode in ("low_latency", "auto")


DISPATCH_CAP_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
"""DeepEP's low-latency buffer size in tokens per rank (SGLang 0.5.23 srt/environ.py, default 128)."""


def _user_cap(spec: MoEDeploymentSpec) -> int | str | None:
    """spec.engine.env's dispatch cap (the last entry wins): an int, "ref" for a valueFrom (unknowable
    here), the raw string when it is not an integer, or None when the spec leaves it to the recipe."""
    found: int | str | None = None
    for entry in spec.engine.env:
        if entry.get("name") != DISPATCH_CAP_ENV:
            continue
        if "value" not in entry:
            found = "ref"
            continue
        raw = str(entry["value"]).strip()
        found = int(raw) if raw.lstrip("-").isdigit() else raw
    return found


def pool_context(spec: MoEDeploymentSpec, pool: Pool) -> PoolContext:
    p = pools(spec)[pool]
    layout = pool_layout(p, spec.topology)
    arch = resolve_architecture(spec.model)
    hardware = spec.topology.hardware
    return PoolContext(
        pool=pool,
        role="standalone" if spec.prefill is None else pool,
        layout=layout,
        arch=arch,
        fp8=arch is not None and weight_dtype(spec.model, arch) == "fp8",
        profile=lookup_profile(hardware) if hardware else None,
        a2a=p.all_to_all_backend if layout.expert_parallel else "none",
        deepep_mode=p.deepep_mode,
        kv_backend=spec.kv_transfer.backend if spec.prefill is not None else None,
        rdma=bool(spec.topology.rdma_resource_name),
        user_cap=_user_cap(spec),
    )
