"""Rules about the command-line flags users pass through to the engine and the router.

Each extraArgs list is read the way the engine's (or router's) argparse reads it, over the flag
catalog of the targeted version (moe_contract.flags): a flag the parser would refuse, one the
operator sets itself under any spelling, a value SGLang only checks after start-up, or a flag
that silently bypasses the operator's expert placement is refused here, at admission, instead
of failing on the GPU pool minutes or an hour later.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_contract.flags import ArgError, Catalog, Occurrence, engine_catalog, resolve, router_catalog

from ..api.spec import MoEDeploymentSpec
from .flags import (
    CONFIG_FILE_DEST,
    DWDP_SIZE,
    ENGINE_LIFTED,
    ENGINE_OWNED,
    MAX_ROUTER_SHUTDOWN_GRACE_S,
    NOT_SERVING_ACTIONS,
    PLACEMENT_BYPASS,
    REBALANCE_THRESHOLD,
    REMOVED_ENGINE_FLAGS,
    ROUTER_OWNED,
    ROUTER_REQUEST_TIMEOUT_FLAG,
    ROUTER_SHUTDOWN_GRACE,
    flag_value,
)
from .problem import Problem


@dataclass(frozen=True)
class _List:
    where: str  # spec.decode.extraArgs
    args: list[str]
    catalog: Catalog
    owned: dict[str, str]
    pool: str  # names the pool in sources: spec.{pool}.nodesPerReplica
    # router: the P/D roles whose list may hold fewer than two instances (one replica, or an
    # autoscaled pool: scaled in, or an instance off the list for its roll)
    short: frozenset[str] = frozenset()

    @property
    def engine(self) -> bool:
        return self.owned is ENGINE_OWNED


def check_extra_args(spec: MoEDeploymentSpec) -> list[Problem]:
    """Every extraArgs entry SGLang 0.5.23 (or its router) would refuse, or that the operator must refuse."""
    engine, router = engine_catalog(), router_catalog()
    lists = [_List("spec.engine.extraArgs", spec.engine.extra_args, engine, ENGINE_OWNED, "decode")]
    if spec.prefill is not None:
        lists.append(
            _List("spec.prefill.extraArgs", spec.prefill.extra_args, engine, ENGINE_OWNED, "prefill")
        )
    lists.append(_List("spec.decode.extraArgs", spec.decode.extra_args, engine, ENGINE_OWNED, "decode"))
    lists.append(
        _List("spec.router.extraArgs", spec.router.extra_args, router, ROUTER_OWNED, "decode", _short(spec))
    )
    problems: list[Problem] = []
    for lst in lists:
        resolution = resolve(lst.catalog, lst.args)
        found: list[tuple[int, Problem | None]] = [
            (e.index, _parse_problem(lst, e)) for e in resolution.errors
        ]
        found += [(o.index, _flag_problem(lst, o)) for o in resolution.occurrences]
        problems += [problem for _, problem in sorted(found, key=lambda f: f[0]) if problem is not None]
    return problems


def _short(spec: MoEDeploymentSpec) -> frozenset[str]:
    if spec.prefill is None:
        return frozenset()  # the router has no roles without P/D
    return frozenset(
        role
        for role, pool in (("prefill", spec.prefill), ("decode", spec.decode))
        if pool.replicas < 2 or (pool.autoscaling is not None and pool.autoscaling.mode == "Operator")
    )


def _at(lst: _List, index: int, text: str) -> Problem:
    field = f"{lst.where}[{index}]"
    return Problem(field, f"{field}: {text}")


def _program(lst: _List) -> str:
    return f"SGLang {lst.catalog.version}" if lst.engine else f"sglang-router {lst.catalog.version}"


def _parse_problem(lst: _List, error: ArgError) -> Problem:
    """What the parser would refuse, as a message with the fix."""
    prog = _program(lst)
    token = error.token
    flag = error.flag.name if error.flag is not None else token.split("=", 1)[0]
    if error.kind == "unknown":
        removed = REMOVED_ENGINE_FLAGS.get(flag) if lst.engine else None
        if removed is not None:
            return _at(
                lst,
                error.index,
                f"{flag} was removed from SGLang ({prog} has no such flag): "
                f"{removed.format(pool=lst.pool)}; remove it from {lst.where}",
            )
        close = lst.catalog.closest(flag)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        return _at(
            lst,
            error.index,
            f"{flag} is not a flag of {prog}, whose parser would exit on it; {hint}fix or remove it",
        )
    if error.kind == "ambiguous":
        return _at(
            lst,
            error.index,
            f"{flag} is ambiguous in {prog}: it abbreviates "
            f"{', '.join(error.matches)}, and the parser exits with 'ambiguous option'; write one "
            f"of them in full",
        )
    if error.kind == "missing_value":
        return _at(
            lst,
            error.index,
            f"{flag} needs a value ({error.reason}): put it in the next item, or write {flag}=VALUE",
        )
    if error.kind == "explicit_value" and error.flag is not None and error.flag.takes_value:
        return _at(
            lst,
            error.index,
            f"{token}: {flag} takes {error.flag.nargs} values ({error.reason}); give them as separate items",
        )
    if error.kind == "explicit_value":
        return _at(
            lst,
            error.index,
            f"{token}: {flag} takes no value ({error.reason}); write {flag} alone to switch it on",
        )
    if error.kind == "invalid_value":
        return _at(lst, error.index, f"{flag}: {error.reason}; give it a valid value")
    if error.kind == "invalid_choice":
        return _at(lst, error.index, f"{flag}: {error.reason}")
    if error.kind == "separator":
        return _at(
            lst,
            error.index,
            f"'--' would make every later argument positional and {prog} would exit on them; remove it",
        )
    if error.flag is not None and not error.flag.takes_value:
        return _at(
            lst,
            error.index,
            f"{token!r} follows {flag}, which takes no value, and {prog} would "
            f"exit on it ({error.reason}); remove {token!r}",
        )
    return _at(
        lst,
        error.index,
        f"{token!r} is not a flag and no flag before it takes it; {prog} would exit "
        "with 'unrecognized arguments': remove it or put its flag before it",
    )


def _spelled(occ: Occurrence) -> str:
    if occ.abbreviated:
        return f"{occ.written} (an abbreviation of {occ.flag.name})"
    if occ.alias:
        return f"{occ.written} (an alias of {occ.flag.name})"
    return occ.written


def _flag_problem(lst: _List, occ: Occurrence) -> Problem | None:
    """A flag the parser takes, refused for what it does."""
    flag, dest = occ.flag, occ.flag.dest
    prog = _program(lst)
    if flag.deprecated is not None and flag.deprecated.refused:
        return _at(lst, occ.index, f"{occ.written}: {prog} refuses it ({flag.deprecated.message}); remove it")
    if flag.action in NOT_SERVING_ACTIONS:
        return _at(
            lst,
            occ.index,
            f"{occ.written} makes {prog} print its {flag.action} and exit instead of "
            f"serving; remove it from {lst.where}",
        )
    if dest in lst.owned:
        source = lst.owned[dest].format(pool=lst.pool)
        fix = "; change that field instead" if source.startswith("spec.") else ""
        return _at(
            lst,
            occ.index,
            f"{_spelled(occ)} is set by the operator from {source}: remove it from {lst.where}{fix}",
        )
    if not lst.engine:
        grace = _shutdown_grace_problem(lst, occ) if dest == ROUTER_SHUTDOWN_GRACE else None
        return grace or _power_of_two_problem(lst, occ) or _range_problem(lst, occ)
    if dest in ENGINE_LIFTED and occ.written != flag.name:
        return _at(
            lst,
            occ.index,
            f"{_spelled(occ)}: write {flag.name} in full; the operator passes it to "
            "the engine through its engine config and recognises only the full name",
        )
    if dest == CONFIG_FILE_DEST:
        return _at(
            lst,
            occ.index,
            f"{occ.written} reads more flags from a file in the container, which "
            f"admission cannot check; pass those flags in {lst.where} instead",
        )
    if dest in PLACEMENT_BYPASS:
        return _at(
            lst,
            occ.index,
            f"{_spelled(occ)} bypasses the operator's expert placement: "
            f"{PLACEMENT_BYPASS[dest]}; remove it from {lst.where}",
        )
    names = lst.catalog.checked_later.get(dest)
    if names is not None and occ.value not in names:
        return _at(
            lst,
            occ.index,
            f"{flag.name} {occ.value!r} is not an EPLB algorithm of {prog} "
            f"({', '.join(names)}); SGLang accepts any string at start-up and looks the name up "
            "only at the first rebalance (after about 1000 forward passes), where every rank "
            "crashes: choose one of those names",
        )
    return _value_problem(lst, occ)


def _value_problem(lst: _List, occ: Occurrence) -> Problem | None:
    dest, value = occ.flag.dest, occ.value
    if dest == REBALANCE_THRESHOLD and isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            return _at(
                lst,
                occ.index,
                f"{occ.flag.name} {value:g} must be in [0.0, 1.0] (SGLang's range); "
                "remove it (1.0, the default, always rebalances)",
            )
        if value < 1.0:
            return _at(
                lst,
                occ.index,
                f"{occ.flag.name} {value:g} bypasses the operator's expert "
                "placement: SGLang skips every rebalance whose window's GPU utilisation is above it, "
                "and the operator's placement is applied (and load reported) only at rebalances; "
                f"remove it from {lst.where} (spec.eplb.minImprovement decides when a placement is "
                "worth moving)",
            )
    if dest == DWDP_SIZE and isinstance(value, int) and value > 1:
        return _at(
            lst,
            occ.index,
            f"{occ.flag.name} {value} replaces the expert all-to-all with weight "
            "prefetch (DWDP), which SGLang refuses together with EPLB and which leaves no expert "
            f"placement to manage; remove it from {lst.where}",
        )
    return None


def _power_of_two_problem(lst: _List, occ: Occurrence) -> Problem | None:
    """sglang-router 0.3.2 stops at start-up with power_of_two over fewer than two workers of a role,
    and the router lists fewer than the spec's replicas while a pool is scaled in or an instance is
    off the list for its roll. The operator picks round_robin for such a list; a policy given here
    would win over it."""
    if occ.flag.dest not in ("prefill_policy", "decode_policy") or occ.value != "power_of_two":
        return None
    role = occ.flag.dest.split("_")[0]
    if role not in lst.short:
        return None  # a fixed pool of two or more: the list always holds two
    fix = (
        "set spec.router.policy: power_of_two instead"
        if role == "prefill"
        else "remove it: the operator already routes decode by power_of_two"
    )
    return _at(
        lst,
        occ.index,
        f"{_spelled(occ)} power_of_two: {_program(lst)} stops at start-up when it lists fewer than two "
        f"{role} instances, as it does with one replica, or while an autoscaled pool is scaled in or "
        f"an instance rolls, and this flag would keep the operator from falling back to round_robin "
        f"then; {fix}",
    )


def _range_problem(lst: _List, occ: Occurrence) -> Problem | None:
    """An integer past what the program's own field holds: the router hands it to Rust, which
    refuses it (OverflowError) before it serves (the catalog's intRanges, probed on the real one)."""
    bounds = lst.catalog.int_ranges.get(occ.flag.dest)
    value = occ.value
    if bounds is None or not isinstance(value, int) or isinstance(value, bool):
        return None
    lo, hi = bounds
    if lo <= value <= hi:
        return None
    return _at(
        lst,
        occ.index,
        f"{_spelled(occ)} {value}: {_program(lst)} takes {lo} to {hi} there and stops at start-up on "
        "anything else; give a value in that range",
    )


def _shutdown_grace_problem(lst: _List, occ: Occurrence) -> Problem | None:
    """The router's shutdown grace becomes its pods' termination grace: bounded (flags.py)."""
    value = occ.value
    if not isinstance(value, int) or isinstance(value, bool):
        return None  # the parser's own refusal reports it
    given = flag_value(lst.args, ROUTER_REQUEST_TIMEOUT_FLAG, lst.catalog)
    timeout = int(given) if given is not None else int(lst.catalog.flag(ROUTER_REQUEST_TIMEOUT_FLAG).default)
    limit = max(0, min(timeout, MAX_ROUTER_SHUTDOWN_GRACE_S))
    if value < 0:
        return _at(
            lst,
            occ.index,
            f"{_spelled(occ)} {value}: sglang-router {lst.catalog.version} takes the grace as an unsigned "
            "number and stops at start-up on a negative one; give 0 or more seconds",
        )
    if value > limit:
        why = (
            f"the router's request timeout ({timeout} s, {ROUTER_REQUEST_TIMEOUT_FLAG}) cuts every request "
            "sooner, so a longer grace only keeps a replaced router pod Terminating"
            if timeout <= MAX_ROUTER_SHUTDOWN_GRACE_S
            else f"a replaced router pod may stay Terminating at most {MAX_ROUTER_SHUTDOWN_GRACE_S} s here"
        )
        return _at(lst, occ.index, f"{_spelled(occ)} {value}: {why}; give at most {limit}")
    return None
