"""`moe-operator`: one command line for the operator, its offline tools and the planners.

Each subcommand group lives next to the code it drives and contributes a
``register(subparsers)`` function; this module only wires them together, importing
lazily so that `moe-operator crds check` does not pay for kopf or numpy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module with `register(subparsers)`
_GROUPS: dict[str, str] = {
    "eplb": "moe_operator.cli.eplb",
    "run": "moe_operator.cli.run",
    "plan": "moe_operator.cli.plan",
    "render": "moe_operator.cli.render",
    "crds": "moe_operator.cli.crds",
    "placement": "moe_operator.cli.placement",
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe-operator",
        description="Kubernetes operator for Mixture-of-Experts inference (SGLang + DeepEP).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, module in _GROUPS.items():
        if wanted is not None and wanted != name:
            # Register a cheap placeholder so --help still lists every command.
            subparsers.add_parser(name, add_help=False)
            continue
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result = func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
