"""Is the move cap or the forecast what keeps the 25%-capped plan above DeepSeek at a scale?

The bench's ``@25%`` column replans every window from the planner's own previous map with
at most a quarter of the copies DeepSeek's map loads in the same transition. At EP144
(2 slots per GPU) it reads 1.0-1.06x on the holdout seeds. This replays the same cases,
same caps, with four move-capped variants side by side, each following its own chain of
maps:

- ``25%``: the bench's plan (forecast from the windows held);
- ``25% clairvoyant``: the same repair fitted on the window it is scored on (its sum and
  32 step samples), the same cap: what a perfect forecast would give this repair;
- ``50%`` and ``100%``: the forecast plan with twice and four times the cap;
- ``uncapped``: the forecast plan from the previous map with no cap.

Ratios are excess over DeepSeek's excess on the same steps, averaged over seeds first (as
the bench does). If the clairvoyant 25% is above 1.0, the cap binds for this repair
whatever the forecast; if below, the forecast is what is missing. Usage:

    .venv/bin/python benchmarks/capped_bound.py [--setups EP144] [--regimes slow,shift,bursty] [--seeds 201,202,203]

About a minute per case at EP144 (4 layers, 8 rebalances, as the bench).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from moe_placement.baseline import baseline_plan
from moe_placement.bench import HISTORY, MOVE_SHARE, rebalance_points, score, step_samples, window_sums
from moe_placement.layout import IntArray
from moe_placement.metrics import gpu_moves
from moe_placement.planner import plan
from moe_placement.regimes import SETUPS, synthetic_counts
from moe_placement.report import WINDOW

VARIANTS = ("25%", "25% clairvoyant", "50%", "100%", "uncapped")


def run(setup_name: str, regime: str, seed: int, layers: int, windows: int) -> dict[str, float]:
    """Excess of DeepSeek and of every variant over the case's scored steps."""
    setup = SETUPS[setup_name]
    shape = setup.shape()
    counts = synthetic_counts(
        setup, regime, window=WINDOW, steps=(HISTORY + windows) * WINDOW, layers=layers, seed=seed
    )
    points = rebalance_points(counts.shape[0], WINDOW)
    maps: dict[str, list[IntArray]] = {k: [] for k in ("base", *VARIANTS)}
    share = {"25%": MOVE_SHARE, "25% clairvoyant": MOVE_SHARE, "50%": 2 * MOVE_SHARE, "100%": 4 * MOVE_SHARE}
    for k, t in enumerate(points):
        held = window_sums(counts, t, WINDOW)
        held_steps = step_samples(counts, t - WINDOW, WINDOW)
        scored = counts[t : t + WINDOW]
        maps["base"].append(baseline_plan(held[-1], **shape))
        for name in VARIANTS:
            clairvoyant = name == "25% clairvoyant"
            loads = scored.sum(axis=0) if clairvoyant else held
            steps = step_samples(counts, t, WINDOW) if clairvoyant else held_steps
            horizon = None if clairvoyant else 1
            if k == 0:  # every chain starts from its own fresh plan
                new = plan(loads, steps=steps, horizon=horizon, dispatch="dynamic", **shape)
            else:
                base_moves = gpu_moves(maps["base"][k - 1], maps["base"][k], setup.num_gpus)
                cap = None if name == "uncapped" else int(share[name] * base_moves)
                new = plan(
                    loads,
                    steps=steps,
                    horizon=horizon,
                    dispatch="dynamic",
                    current=maps[name][-1],
                    max_moves=cap,
                    **shape,
                )
            maps[name].append(new.physical_to_logical_map)
    scores = {k: score(counts, v, points, WINDOW, setup, "dynamic") for k, v in maps.items()}
    out = {k: s.excess for k, s in scores.items()}
    base_moved = max(1, scores["base"].moved)
    out.update({f"{k} moves": scores[k].moved / base_moved for k in VARIANTS})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups", default="EP144")
    ap.add_argument("--regimes", default="stationary,slow,fast,phases,shift,bursty")
    ap.add_argument("--seeds", default="201,202,203")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--windows", type=int, default=8)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(
        f"seeds {seeds}; ratio = variant excess / DeepSeek (last window) excess; moves = copies loaded / DeepSeek's"
    )
    print(f"{'setup':8} {'traffic':11} | " + " ".join(f"{v:>16}" for v in VARIANTS) + " | moves (same order)")
    for setup_name in args.setups.split(","):
        for regime in args.regimes.split(","):
            started = time.perf_counter()
            rows = [run(setup_name, regime, seed, args.layers, args.windows) for seed in seeds]
            base = np.mean([r["base"] for r in rows])
            ratios = [np.mean([r[v] for r in rows]) / base for v in VARIANTS]
            moves = [np.mean([r[f"{v} moves"] for r in rows]) for v in VARIANTS]
            print(
                f"{setup_name:8} {regime:11} | "
                + " ".join(f"{x:16.3f}" for x in ratios)
                + " | "
                + " ".join(f"{m:.2f}" for m in moves)
                + f"  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
