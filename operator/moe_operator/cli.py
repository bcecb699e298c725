"""`moe-operator`: one command line for the operator, the sandbox and the planners.

Each subcommand group lives next to the code it drives and contributes a
``register(subparsers)`` function; this module only wires them together, importing
lazily so that `moe-operator sandbox status` does not pay for kopf or numpy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module with `register(subparsers)`
_GROUPS: dict[str, str] = {
    "sandbox": "moe_operator.sandbox.cli",
    "eplb": "moe_operator.eplb.cli",
    "run": "moe_operator.handlers.cli",
    "plan": "moe_operator.topology.cli",
    "crds": "moe_operator.api.cli",
    "placement": "moe_operator.control.cli",
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
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(module):
                continue  # that part of the product is not built yet
            raise
        mod.register(subparsers)
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
