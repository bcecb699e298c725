"""Small helpers shared by the rule modules."""

from __future__ import annotations

from ..api.spec import MoEDeploymentSpec, PoolSpec

GIB = 2**30


def pools(spec: MoEDeploymentSpec) -> list[tuple[str, PoolSpec]]:
    """The pools present in the spec, by name, prefill first."""
    found: list[tuple[str, PoolSpec]] = []
    if spec.prefill is not None:
        found.append(("prefill", spec.prefill))
    found.append(("decode", spec.decode))
    return found


def gib(value: float) -> str:
    """Bytes as GiB with one decimal, for messages."""
    return f"{value / GIB:.1f} GiB"
