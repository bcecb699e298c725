"""Generate the flag catalogs of SGLang and its router from the installed wheels' own parsers.

Run in the runtime venv (torch + the real sglang and sglang-router packages):

    .venv-runtime/bin/python tools/flag_catalog.py            # rewrite contract/moe_contract/catalogs/
    .venv-runtime/bin/python tools/flag_catalog.py --check    # exit 1 when a committed catalog drifts

The engine's parser is built as SGLang builds it (``ServerArgs.add_cli_args`` on a fresh
``argparse.ArgumentParser``, the argument definitions of ``sglang/srt/arg_groups/fields/*.py``
plus the flags ServerArgs adds: dynamic choices, ``--config``, deprecated spellings). The
router's is the one ``sglang_router.launch_router.parse_router_args`` builds, captured while
it parses an empty command line. Every action becomes one record: option strings (aliases
included), dest, action kind, nargs, type, choices, default, const, deprecation. Names the
engine checks only after parsing (the EPLB algorithm, a free string on the command line) are
captured from the enum that checks them. The router's integer flags also get the range its
Rust fields take (``intRanges``), probed through ``Router.from_args`` at the integer types'
edges: a value past it stops the router at start-up. The operator reads these files through
moe_contract.flags and never imports sglang.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import io
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
CATALOG_DIR = REPO / "contract" / "moe_contract" / "catalogs"
SCHEMA_VERSION = 1

_KINDS: dict[type[argparse.Action], str] = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._ExtendAction: "extend",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse.BooleanOptionalAction: "boolean_optional",
}
_DEPRECATED_HELP = re.compile(r"^\(?\s*deprecated\b", re.IGNORECASE)


def engine_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def router_parser() -> argparse.ArgumentParser:
    """The parser ``parse_router_args`` (the ``launch_router`` entry point) builds, as it built it."""
    from sglang_router import launch_router

    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def spy(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        seen.append(self)
        return original(self, args, namespace)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", spy):
        launch_router.parse_router_args([])
    return seen[-1]


def eplb_algorithm_names(parser: argparse.ArgumentParser) -> list[str]:
    """What ``compute_algorithm`` accepts: the flag's default ('auto', resolved there) and the enum's names."""
    from sglang.srt.eplb.eplb_algorithms import EplbAlgorithm

    default = next(a.default for a in parser._actions if a.dest == "eplb_algorithm")
    return [default, *(m.name for m in EplbAlgorithm)]


def _type_name(fn: Callable[..., Any] | None) -> str | None:
    if fn is None:
        return None
    module = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return name if module == "builtins" else f"{module}.{name}"


def _kind(action: argparse.Action) -> str:
    cls = type(action)
    if cls in _KINDS:
        return _KINDS[cls]
    return f"custom:{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any) -> Any:
    """A JSON value for a default, const or choice; anything else as its repr."""
    if value is argparse.SUPPRESS:
        return {"suppress": True}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=_order)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    return {"repr": repr(value)}


def _order(value: Any) -> tuple[str, str]:
    return (type(value).__name__, json.dumps(value, sort_keys=True))


def _deprecation(action: argparse.Action) -> dict[str, Any] | None:
    help_text = " ".join((action.help or "").split())
    is_class = type(action).__name__.startswith("Deprecated")
    if not is_class and not _DEPRECATED_HELP.match(help_text):
        return None
    error = getattr(action, "error_message", None)
    return {
        "replacement": getattr(action, "new_flag", None),
        "refused": error is not None,
        "message": error or help_text,
    }


def flag_record(action: argparse.Action) -> dict[str, Any]:
    const = getattr(action, "const_value", None)
    if const is None:
        const = action.const
    choices = None if action.choices is None else sorted((_plain(c) for c in action.choices), key=_order)
    return {
        "options": list(action.option_strings),
        "dest": action.dest,
        "action": _kind(action),
        "nargs": action.nargs,
        "type": _type_name(action.type),
        "choices": choices,
        "default": _plain(action.default),
        "const": _plain(const),
        "required": bool(action.required),
        "deprecated": _deprecation(action),
    }


def catalog(
    parser: argparse.ArgumentParser,
    program: str,
    distribution: str,
    entry: str,
    checked_later: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    if positionals or parser._mutually_exclusive_groups:
        raise SystemExit(
            f"{program}: positionals {positionals} or mutually exclusive groups appeared; "
            "moe_contract.flags.resolve handles neither: extend it first"
        )
    return {
        "schemaVersion": SCHEMA_VERSION,
        "program": program,
        "distribution": distribution,
        "version": md.version(distribution),
        "entry": entry,
        "generator": "tools/flag_catalog.py",
        "allowAbbrev": parser.allow_abbrev,
        "prefixChars": parser.prefix_chars,
        "checkedLater": checked_later,
        "flags": [flag_record(a) for a in parser._actions],
    }


def engine_catalog() -> dict[str, Any]:
    parser = engine_parser()
    later = {
        "eplb_algorithm": {
            "names": eplb_algorithm_names(parser),
            "source": "sglang.srt.eplb.eplb_algorithms.EplbAlgorithm (looked up by compute_algorithm "
            "at the first rebalance)",
        }
    }
    return catalog(parser, "sglang", "sglang", "python -m sglang.launch_server", later)


# Values tried on each integer flag of the router: the edges of the Rust integer types its
# fields may have (i8..i64, u8..u64), so the range found is the field's own.
_LOWS = (-(2**63), -(2**31), -(2**15), -(2**7), -1, 0, 1)
_HIGHS = (2**7 - 1, 2**8 - 1, 2**15 - 1, 2**16 - 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)


def router_int_ranges(parser: argparse.ArgumentParser) -> dict[str, list[int]]:
    """dest -> [lowest, highest] value of each integer flag that the Rust router's field holds: what
    ``launch_router`` takes up to ``Router.from_args``, which hands the values over (PyO3 refuses a
    negative number for an unsigned field, and one past the field's width, with OverflowError: the
    router exits at start-up). Probed at the integer types' edges; a flag that takes every edge is
    not handed over with the default settings (a history backend's pool sizes) and is left out.
    The router checks more when it starts (minimums such as 1), which this does not find."""
    from sglang_router.launch_router import parse_router_args
    from sglang_router.router import Router

    def takes(option: str, value: int) -> bool:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = parse_router_args(["--worker-urls", "http://127.0.0.1:1", option, str(value)])
                args._validate_router_args()
                Router.from_args(args)
        except KeyboardInterrupt:
            raise
        except BaseException:  # argparse's SystemExit, OverflowError, and pyo3's PanicException
            return False
        return True

    ranges: dict[str, list[int]] = {}
    for action in parser._actions:
        if action.type is not int or action.nargs is not None or not action.option_strings:
            continue
        option = next(o for o in action.option_strings if o.startswith("--"))
        lows = [v for v in _LOWS if takes(option, v)]
        highs = [v for v in _HIGHS if takes(option, v)]
        if lows and highs and (min(lows), max(highs)) != (_LOWS[0], _HIGHS[-1]):
            ranges[action.dest] = [min(lows), max(highs)]  # every edge taken: not handed over here
    return ranges


def router_catalog() -> dict[str, Any]:
    parser = router_parser()
    doc = catalog(parser, "sglang-router", "sglang-router", "python -m sglang_router.launch_router", {})
    doc["intRanges"] = {
        "source": "sglang_router.router.Router.from_args at the integer types' edges "
        "(tools/flag_catalog.py router_int_ranges)",
        "ranges": router_int_ranges(parser),
    }
    return doc


def file_name(doc: dict[str, Any]) -> str:
    return f"{doc['program']}-{doc['version']}.json"


def dumps(doc: dict[str, Any]) -> str:
    """Pretty JSON with one flag per line, so a regenerated catalog diffs flag by flag."""
    head = {k: v for k, v in doc.items() if k != "flags"}
    text = json.dumps(head, indent=1)[:-2]
    rows = ",\n".join("  " + json.dumps(flag, sort_keys=False) for flag in doc["flags"])
    return f'{text},\n "flags": [\n{rows}\n ]\n}}\n'


def generate() -> list[dict[str, Any]]:
    return [engine_catalog(), router_catalog()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare with the committed catalogs, write nothing")
    p.add_argument("--out-dir", type=Path, default=CATALOG_DIR)
    args = p.parse_args(argv)
    drift = 0
    for doc in generate():
        path = args.out_dir / file_name(doc)
        text = dumps(doc)
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(
                    f"{path}: differs from the installed {doc['distribution']} {doc['version']}",
                    file=sys.stderr,
                )
                drift += 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(doc['flags'])} flags)")
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
