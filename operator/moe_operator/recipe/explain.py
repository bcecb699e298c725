"""The recipe as text a platform engineer can audit before applying a deployment."""

from __future__ import annotations

from ..api import MoEDeploymentSpec
from ..api.derived import pools
from .checks import recipe_findings
from .context import pool_context
from .derive import derive_pool, kept, user_args, user_env_names
from .startup import startup_timeout_s


def explain(spec: MoEDeploymentSpec) -> str:
    """Every derived setting per pool (and whether the user overrides it), with rule and source."""
    profile = spec.topology.hardware or "(none: generic defaults)"
    lines = [
        f"hardware profile: {profile}",
        f"start-up allowance: {int(startup_timeout_s(spec))} s"
        + (" (spec.engine.startupTimeout)" if spec.engine.startup_timeout else " (derived)"),
    ]
    env_names = user_env_names(spec)
    for pool in pools(spec):
        ctx = pool_context(spec, pool)
        layout = ctx.layout
        lines.append("")
        lines.append(
            f"[{pool}] role {ctx.role}, {layout.nodes} node(s) x {layout.gpus_per_node} GPUs, EP{layout.ep_size}, "
            f"attention DP {layout.attention_dp}, all-to-all {ctx.a2a}"
        )
        derived = derive_pool(spec, pool)
        survivors = set(kept(derived, user_args(spec, pool), env_names))
        if not derived:
            lines.append("  (no derived settings)")
        for s in derived:
            shown = s.name if s.kind == "arg" and s.value is None else f"{s.name}={s.value}"
            state = "" if s in survivors else "  [overridden by the spec]"
            lines.append(f"  {s.kind:3} {shown}{state}")
            lines.append(f"      why: {s.rule}")
            lines.append(f"      source: {s.source}")
        user = user_args(spec, pool)
        if user:
            lines.append(f"  user extraArgs (after the recipe's): {' '.join(user)}")
    findings = recipe_findings(spec)
    if findings:
        lines.append("")
        lines += [f"{f.severity.upper()}: {f.message}" for f in findings]
    return "\n".join(lines) + "\n"
