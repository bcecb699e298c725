"""`moe-operator eplb ...`: plan a placement from a load file, or run the benchmark.

``plan`` reads SGLang's ``logical_count`` ([T][L][E] or [L][E]) and writes a file with only
``physical_to_logical_map``, so it can be passed straight to ``--init-expert-location``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def register(subparsers: Any) -> None:
    """Add the ``eplb`` command group to the top-level ``moe-operator`` parser."""
    parser = subparsers.add_parser(
        "eplb", help="expert placement: plan a map, benchmark against DeepSeek EPLB"
    )
    sub = parser.add_subparsers(dest="eplb_command", metavar="COMMAND", required=True)

    p = sub.add_parser("plan", help="plan a physical_to_logical_map from recorded expert loads")
    p.add_argument(
        "--load", required=True, type=Path, help='JSON {"logical_count": [T][L][E] or [L][E]}, newest last'
    )
    p.add_argument("--num-gpus", required=True, type=int)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--redundant", type=int, default=0, help="redundant expert slots (E + R slots in all)")
    p.add_argument(
        "--groups", type=int, default=1, help="expert groups (hierarchical when groups %% nodes == 0)"
    )
    p.add_argument("--current", type=Path, help='current placement, JSON {"physical_to_logical_map": [L][P]}')
    p.add_argument("--max-moves", type=int, help="cap on slots that change versus --current")
    p.add_argument("--min-layer-gain", type=float, default=0.0, help="relative gain a layer needs to change")
    p.add_argument(
        "--horizon",
        type=int,
        help="steps the plan should serve (default: an eighth of the history; give it about eight windows)",
    )
    p.add_argument(
        "--dispatch", choices=("static", "dynamic"), default="static", help="engine's dispatch rule"
    )
    p.add_argument("-o", "--output", required=True, type=Path)
    p.set_defaults(func=run_plan)

    b = sub.add_parser("bench", help="side-by-side table: ours vs DeepSeek EPLB on synthetic traces")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--window", type=int, default=64, help="steps between rebalances")
    b.add_argument("--windows", type=int, default=8, help="rebalances scored per row")
    b.add_argument("--layers", type=int, default=8, help="MoE layers simulated per row")
    b.add_argument("--setups", default="EP8,EP32,EP72,EP144")
    b.add_argument("--regimes", default="steady,shifting")
    b.add_argument("--dispatch", choices=("dynamic", "static", "both"), default="dynamic")
    b.add_argument(
        "--bound",
        action="store_true",
        help="also score our packer told the true next-window mean (oracle column)",
    )
    b.add_argument(
        "--timing", choices=("all", "288", "none"), default="all", help="DeepSeek-V3-scale planning time"
    )
    b.set_defaults(func=run_bench)


def _read_json(path: Path, key: str) -> Any:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or key not in data:
        raise ValueError(f'{path} must be a JSON object with a "{key}" key')
    return data[key]


def run_plan(args: argparse.Namespace) -> int:
    from moe_placement.planner import plan

    try:
        loads = np.asarray(_read_json(args.load, "logical_count"), dtype=np.float64)
        current = None
        if args.current is not None:
            current = np.asarray(_read_json(args.current, "physical_to_logical_map"))
        result = plan(
            loads,
            num_gpus=args.num_gpus,
            num_nodes=args.num_nodes,
            num_redundant=args.redundant,
            num_groups=args.groups,
            current=current,
            dispatch=args.dispatch,
            max_moves=args.max_moves,
            min_layer_gain=args.min_layer_gain,
            horizon=args.horizon,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.output.write_text(json.dumps({"physical_to_logical_map": result.physical_to_logical_map.tolist()}))
    bal = result.predicted_balancedness
    print(
        f"predicted balancedness ({args.dispatch}): mean {bal.mean():.4f}, worst layer {bal.min():.4f}; "
        f"moved slots {result.moved_slots}; changed layers {int(result.changed_layers.sum())}/{bal.size}",
        file=sys.stderr,
    )
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from moe_placement.bench import SETUPS, calibration, compare, format_rows, time_planning

    names = [s for s in args.setups.split(",") if s]
    unknown = [s for s in names if s not in SETUPS]
    if unknown:
        print(f"error: unknown setups {unknown}; known: {sorted(SETUPS)}", file=sys.stderr)
        return 2
    dispatches = ("dynamic", "static") if args.dispatch == "both" else (args.dispatch,)
    print(f"trace calibration: {calibration(args.seed)}")
    print(
        f"future-window scoring: window {args.window} steps, {args.windows} rebalances, {args.layers} layers, "
        f"seed {args.seed}; excess = mean over steps and layers of max/mean - 1 (lower is better)\n"
    )
    rows = []
    for dispatch in dispatches:
        for regime in (r for r in args.regimes.split(",") if r):
            for name in names:
                rows.append(
                    compare(
                        SETUPS[name],
                        regime,
                        window=args.window,
                        windows=args.windows,
                        layers=args.layers,
                        seed=args.seed,
                        dispatch=dispatch,
                        with_bound=args.bound,
                    )
                )
                print(
                    format_rows(rows[-1:]).splitlines()[-1] if len(rows) > 1 else format_rows(rows),
                    flush=True,
                )
    print(
        "\nratio = ours / baseline; oracle (--bound) = our packer told the true next-window mean, without "
        "hedging (a reference, not a strict bound); "
        "ours@25% = ours given its previous map and at most 25% of the baseline's moves per rebalance "
        "(moves = ours / baseline)."
    )
    if args.timing != "none":
        print(
            "\nplanning time at DeepSeek-V3 scale (58 layers, 256 experts + 32 redundant, 8 groups), median ms:"
        )
        sizes = [(288, 36)] if args.timing == "288" else [(32, 4), (72, 9), (144, 18), (288, 36)]
        for gpus, nodes in sizes:
            t = time_planning(gpus, nodes, repeats=3 if gpus == 288 else 1)
            print(
                f"  {gpus:>3} GPUs / {nodes:>2} nodes ({(256 + 32) // gpus} slots/GPU): "
                + ", ".join(f"{k} {v:.0f}" for k, v in t.items()),
                flush=True,
            )
    return 0
