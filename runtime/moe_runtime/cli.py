"""``moe-runtime``: the engine pod's entry point.

launch      start the sidecar and SGLang for this pod (the container's command)
print-args  print the SGLang command this pod would run (dry run; used by goldens)
sidecar     run only the sidecar (an engine started some other way)
replay      GPU-less stand-in engine serving the sidecar API
bench       sidecar CPU/memory and hook overhead at DeepSeek-V3 size
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from moe_runtime.config import ConfigError


def _refuse(exc: ConfigError) -> int:
    print(f"moe-runtime: refusing to start: {exc}", file=sys.stderr)
    return 2


def cmd_print_args(args: argparse.Namespace) -> int:
    from moe_runtime.launcher.run import plan_launch

    try:
        plan = plan_launch(
            args.config, state_dir=args.state_dir, python=args.python, write_init=args.write_init
        )
    except ConfigError as exc:
        return _refuse(exc)
    if args.format == "json":
        print(
            json.dumps({"argv": plan.argv, "init": str(plan.init.path) if plan.init.path else None}, indent=2)
        )
    else:
        print(shlex.join(plan.argv))
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from moe_runtime.launcher.run import launch, plan_launch, sidecar_options

    try:
        plan = plan_launch(args.config, state_dir=args.state_dir)
        opts = sidecar_options(plan)
    except ConfigError as exc:
        return _refuse(exc)
    print("moe-runtime: " + shlex.join(plan.argv), flush=True)
    return asyncio.run(launch(plan, opts))


def cmd_sidecar(args: argparse.Namespace) -> int:
    from moe_runtime.launcher.run import plan_launch, sidecar_options
    from moe_runtime.sidecar.service import Sidecar

    try:
        plan = plan_launch(args.config, state_dir=args.state_dir, write_init=False)
    except ConfigError as exc:
        return _refuse(exc)

    async def run() -> int:
        sidecar = Sidecar(sidecar_options(plan))
        await sidecar.start()
        try:
            await asyncio.Event().wait()
        finally:
            await sidecar.stop()
        return 0

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from moe_runtime.replay.server import serve

    try:
        return asyncio.run(serve(args))
    except ConfigError as exc:
        return _refuse(exc)


def cmd_bench(args: argparse.Namespace) -> int:
    from moe_runtime.bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe-runtime", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            default=None,
            help="engine config JSON (default: $MOE_ENGINE_CONFIG or /etc/moe/engine/engine.json)",
        )
        p.add_argument(
            "--state-dir",
            default=None,
            help="exchange dir (default: $MOE_RUNTIME_STATE_DIR or /tmp/moe-runtime)",
        )

    p = sub.add_parser("launch", help="start sidecar + SGLang for this pod")
    with_config(p)
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("print-args", help="print the SGLang command for this pod")
    with_config(p)
    p.add_argument("--python", default="python3", help="interpreter to show in the command")
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.add_argument(
        "--no-write-init",
        dest="write_init",
        action="store_false",
        help="do not write the init placement file",
    )
    p.set_defaults(func=cmd_print_args)

    p = sub.add_parser("sidecar", help="run only the sidecar")
    with_config(p)
    p.set_defaults(func=cmd_sidecar)

    from moe_runtime.replay.server import add_arguments

    p = sub.add_parser("replay", help="GPU-less replay engine serving the sidecar API")
    add_arguments(p)
    p.set_defaults(func=cmd_replay)

    from moe_runtime.bench import add_arguments as bench_arguments

    p = sub.add_parser("bench", help="sidecar CPU/memory and hook overhead at DeepSeek-V3 size")
    bench_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if getattr(args, "state_dir", None) is not None and args.command != "replay":
        Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
