"""Rules about the command-line flags users pass through to the engine and the router."""

from __future__ import annotations

from ..api.spec import MoEDeploymentSpec
from .flags import ENGINE_FLAGS, ROUTER_FLAGS, flag_name
from .problem import Problem


def check_extra_args(spec: MoEDeploymentSpec) -> list[Problem]:
    """Flags the operator derives from the spec are refused in every extraArgs list."""
    lists: list[tuple[str, list[str], dict[str, str], str]] = [
        ("spec.engine.extraArgs", spec.engine.extra_args, ENGINE_FLAGS, "decode"),
    ]
    if spec.prefill is not None:
        lists.append(("spec.prefill.extraArgs", spec.prefill.extra_args, ENGINE_FLAGS, "prefill"))
    lists.append(("spec.decode.extraArgs", spec.decode.extra_args, ENGINE_FLAGS, "decode"))
    lists.append(("spec.router.extraArgs", spec.router.extra_args, ROUTER_FLAGS, "decode"))
    problems: list[Problem] = []
    for where, args, owned, pool in lists:
        for i, arg in enumerate(args):
            flag = flag_name(arg)
            if flag is None or flag not in owned:
                continue
            source = owned[flag].format(pool=pool)
            problems.append(
                Problem(
                    f"{where}[{i}]",
                    f"{where}[{i}]: {flag} is set by the operator from {source}; remove it from {where} "
                    "and set that field instead",
                )
            )
    return problems
