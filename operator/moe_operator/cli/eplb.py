"""`moe-operator eplb ...`: plan a placement from a load file, or run the benchmark.

``plan`` reads SGLang's ``logical_count`` ([T][L][E] or [L][E]) and writes a file with only
``physical_to_logical_map``, so it can be passed straight to ``--init-expert-location``.
"""

from __future__ import annotations

import argparse
import json
import os
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

    b = sub.add_parser(
        "bench",
        help="side-by-side tables: ours vs DeepSeek EPLB (as engines run it) on future traffic",
        description="Fit on the past, score on the next window. Defaults: the holdout seeds and every "
        "regime and schedule (the development set is --seeds dev with DEV regimes; see docs/placement.md).",
    )
    b.add_argument(
        "--suite",
        default="synthetic,real,packing,cluster,timing",
        help="comma list of synthetic, real, packing, cluster, timing",
    )
    b.add_argument(
        "--seeds",
        default="holdout",
        help="holdout (201,202,203), first-holdout (101,102,103), dev (1,2,3) or a comma list",
    )
    b.add_argument("--setups", default="EP8,EP32,EP32flat,EP72,EP144", help="synthetic deployments")
    b.add_argument(
        "--regimes",
        default="stationary,slow,fast,phases,shift,bursty",
        help="synthetic regimes (dev: stationary,slow,fast,phases)",
    )
    b.add_argument("--real-setups", default="R8,R16", help="real-routing deployments (64 experts)")
    b.add_argument("--modes", default="decode,prefill", help="real-routing batching")
    b.add_argument(
        "--schedules",
        default="uniform,single,phases,walk,diurnal,shift,burst",
        help="real-routing traffic-mix schedules (dev: uniform,single,phases,walk)",
    )
    b.add_argument("--packing-setups", default="EP8,EP32,EP72,EP144,EP288")
    b.add_argument(
        "--cluster",
        default="real:R8:decode-diurnal,real:R8:prefill-diurnal,synthetic:EP8:fast,synthetic:EP72:slow",
        help="kind:setup:traffic cases (real traffic is mode-schedule)",
    )
    b.add_argument("--replicas", default="2,4,8")
    b.add_argument("--affinity", default="0,0.5", help="share of a replica's traffic from its home domain")
    b.add_argument("--layers", type=int, default=4, help="MoE layers simulated per synthetic case")
    b.add_argument("--windows", type=int, default=8, help="rebalances scored per case")
    b.add_argument("--dispatch", choices=("dynamic", "static"), default="dynamic")
    b.add_argument(
        "--inputs",
        choices=("steps", "windows"),
        default="steps",
        help="what the planner holds: window sums plus step samples, or window sums only",
    )
    b.add_argument("--timing", choices=("all", "288"), default="all", help="sizes for the timing suite")
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


def _ints(text: str, name: str, known: dict[str, tuple[int, ...]] | None = None) -> list[int]:
    if known and text in known:
        return list(known[text])
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError as exc:
        raise ValueError(
            f"--{name} must be a comma list of integers{' or ' + '/'.join(known) if known else ''}"
        ) from exc


def _names(text: str, name: str, known: object) -> list[str]:
    out = [v for v in text.split(",") if v]
    unknown = [v for v in out if v not in known]  # type: ignore[operator]
    if unknown:
        raise ValueError(f"--{name}: unknown {unknown}; known: {sorted(known)}")  # type: ignore[call-overload]
    return out


def run_bench(args: argparse.Namespace) -> int:
    from moe_placement import report
    from moe_placement.regimes import (
        DEV_SEEDS,
        FIRST_HOLDOUT_SEEDS,
        HOLDOUT_SEEDS,
        REAL,
        REAL_SETUPS,
        SETUPS,
        SYNTHETIC_REGIMES,
    )
    from moe_placement.routing import SCHEDULES

    try:
        suites = _names(args.suite, "suite", ("synthetic", "real", "packing", "cluster", "timing"))
        seeds = _ints(
            args.seeds,
            "seeds",
            {"dev": DEV_SEEDS, "holdout": HOLDOUT_SEEDS, "first-holdout": FIRST_HOLDOUT_SEEDS},
        )
        setups = _names(args.setups, "setups", SETUPS)
        regimes = _names(args.regimes, "regimes", SYNTHETIC_REGIMES)
        real_setups = _names(args.real_setups, "real-setups", REAL_SETUPS)
        modes = _names(args.modes, "modes", REAL)
        schedules = _names(args.schedules, "schedules", SCHEDULES)
        packing = _names(args.packing_setups, "packing-setups", SETUPS)
        replicas = _ints(args.replicas, "replicas")
        affinity = [float(v) for v in args.affinity.split(",") if v]
        cases = []
        for spec in (c for c in args.cluster.split(",") if c):
            kind, name, traffic = spec.split(":")
            if kind not in ("real", "synthetic") or name not in (REAL_SETUPS if kind == "real" else SETUPS):
                raise ValueError(f"--cluster: bad case {spec!r} (kind:setup:traffic)")
            cases.append((kind, name, traffic))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kw = {"windows": args.windows, "dispatch": args.dispatch, "inputs": args.inputs}
    print(
        f"seeds {seeds}; planner holds {'8 window sums + 32 step samples of the last window' if args.inputs == 'steps' else '8 window sums'}; "
        f"baseline: DeepSeek EPLB on the last window; scored on each step of the next window, {args.dispatch} dispatch; "
        "excess = mean over steps and layers of max/mean GPU load - 1; ratio = ours / baseline (lower is better)\n",
        flush=True,
    )
    if "synthetic" in suites:
        print(
            f"== synthetic traffic ({args.layers} layers, {report.WINDOW}-step windows, {args.windows} rebalances)"
        )
        print(report.HEAD, flush=True)
        rows = report.synthetic_rows(setups, regimes, seeds, layers=args.layers, **kw)
        groups = report.group(rows)
        for g in groups:
            print(report.format_group(g))
        print(report.summary(groups, "synthetic") + "\n", flush=True)
    if "real" in suites:
        print("== real OLMoE-1B-7B routing (64 experts, top-8, layers 0/7/15)")
        for mode in modes:
            print(f"   {REAL[mode].describe(mode)}")
        print(report.HEAD, flush=True)
        rows = report.real_rows(real_setups, modes, schedules, seeds, **kw)
        groups = report.group(rows)
        for g in groups:
            print(report.format_group(g))
        for mode in modes:
            for name in real_setups:
                sel = [g for g in groups if g.setup == name and g.regime.startswith(mode)]
                print(report.summary(sel, f"{name} {mode}, over schedules"))
        print(flush=True)
    if "packing" in suites:
        print("== packing alone: fitted and scored on the same window (stationary traffic, no forecasting)")
        print(
            report.format_packing(
                report.packing_rows(packing, seeds, layers=args.layers, windows=args.windows)
            )
        )
        print(flush=True)
    if "cluster" in suites:
        print(
            "== cluster: replicas of a pool, each its own batch stream; scored on every replica's next window"
        )
        rows_c = report.cluster_rows(cases, replicas, affinity, seeds, layers=args.layers, **kw)
        print(report.format_cluster(rows_c) + "\n", flush=True)
    if "timing" in suites:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            "== planning time at DeepSeek-V3 scale (58 layers, 256 experts + 32 redundant, 8 groups), "
            f"median wall ms of 5 (load average {load:.1f} on {os.cpu_count()} cores):"
        )
        sizes = [(288, 36)] if args.timing == "288" else [(32, 4), (72, 9), (144, 18), (288, 36)]
        for line in report.format_timing(sizes, repeats=5):
            print(line, flush=True)
    return 0
