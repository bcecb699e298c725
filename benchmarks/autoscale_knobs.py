"""Does any setting of the autoscaler's knobs meet the SLO on a trace for less than the fixed size?

``autoscale_bench.py`` scores the defaults and ``burstReserve: 150``. This sweeps the knobs that
buy capacity ahead of a burst, ``targetUtilization`` (spare capacity as a share of the load, told
in advance), ``burstReserve`` (spare capacity as a multiple of the largest rise remembered,
learned) and, with ``--burst-memory``, how long that rise is remembered, over the same simulator
and traces, and prints per trace and seed the setting with the fewest GPU-hours that meets the
SLO in 99% of intervals, as a ratio to the fixed size chosen in hindsight on that very trace
(``fixed``) and to the one fixed size that meets 99% on every trace of the kind in the run
(``fixed/all``); then the one setting that meets 99% on every trace and seed, with the fewest
GPU-hours in all. A ratio above 1.00 in the first column means no setting swept beats that day's
hindsight size. With ``--per-pool`` it also searches a setting per pool (prefill and decode each
their own, the same burstMemory): the pools run apart in the simulator, so each pair is scored
exactly from the runs of the two settings. Usage:

    .venv/bin/python benchmarks/autoscale_knobs.py [--traces bursty,flash] [--seeds 0,1,2,3] \\
        [--utilization 50,...,90] [--reserve 0,50,...,300] [--burst-memory 6] [--per-pool]

About a second per setting, trace and seed on one core (54 settings by default).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from autoscale_bench import fixed, fixed_size, run, run_pools, slo_controller, trace

UTILIZATION = "50,55,60,65,70,75,80,85,90"  # percent: targetUtilization
RESERVE = "0,50,100,150,200,300"  # percent: burstReserve
MEMORY = "6"  # hours: burstMemory

Setting = tuple[int, int, float]  # targetUtilization, burstReserve, burstMemory hours
Pools = dict[str, tuple[np.ndarray, float]]  # per pool: intervals met, GPU-hours


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _label(s: Setting) -> str:
    return f"targetUtilization {s[0]} burstReserve {s[1]} burstMemory {s[2]:g}h"


def per_pool(runs: dict[Setting, list[Pools]], base: list[float]) -> str:
    """The cheapest (prefill setting, decode setting) pair meeting 99% on every seed."""
    best: tuple[float, Setting, Setting, list[tuple[float, float]]] | None = None
    for sp, sd in itertools.product(runs, runs):
        if sp[2] != sd[2]:
            continue
        scores = []
        for p_run, d_run, b in zip(runs[sp], runs[sd], base, strict=True):
            (pm, pg), (dm, dg) = p_run["prefill"], d_run["decode"]
            scores.append((float((pm & dm).mean()), (pg + dg) / b))
        if min(m for m, _ in scores) < 0.99:
            continue
        total = sum(r for _, r in scores)
        if best is None or total < best[0]:
            best = (total, sp, sd, scores)
    if best is None:
        return "no pair meets 99% on every seed"
    _, sp, sd, scores = best
    return (
        f"prefill {_label(sp)}, decode {_label(sd)}: {min(m for m, _ in scores):.2%}-"
        f"{max(m for m, _ in scores):.2%}, x{min(r for _, r in scores):.2f}-x{max(r for _, r in scores):.2f} "
        "the day's fixed size"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default="bursty,flash")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--boot", type=float, default=300.0)
    ap.add_argument("--utilization", default=UTILIZATION, help="targetUtilization values, percent")
    ap.add_argument("--reserve", default=RESERVE, help="burstReserve values, percent")
    ap.add_argument("--burst-memory", default=MEMORY, help="burstMemory values, hours")
    ap.add_argument("--per-pool", action="store_true", help="also search a setting per pool")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    memories = tuple(float(x) for x in a.burst_memory.split(","))
    settings: list[Setting] = [
        (u, r, m) for u in _ints(a.utilization) for r in _ints(a.reserve) for m in memories
    ]
    print(
        f"targetUtilization {a.utilization} x burstReserve {a.reserve} x burstMemory {a.burst_memory} h; "
        f"boot {a.boot:g}s; prior x0.7"
    )
    for kind in a.traces.split(","):
        t0 = time.perf_counter()
        lams = {seed: trace(kind, seed, a.hours) for seed in seeds}
        every = fixed_size(list(lams.values()))
        scores: dict[Setting, list[tuple[float, float, float, float]]] = {s: [] for s in settings}
        runs: dict[Setting, list[Pools]] = {s: [] for s in settings}
        bases: list[float] = []
        for seed, lam in lams.items():
            base, size = fixed(lam, a.boot, seed)
            bases.append(base["gpu_h"])
            everywhere = run(lam, every, None, a.boot, seed)["gpu_h"]
            for s in settings:
                ctl = slo_controller(
                    0.7, a.boot, reserve=s[1] / 100, headroom=s[0] / 100, memory_s=s[2] * 3600
                )
                pools = run_pools(lam, dict(size), ctl, a.boot, seed)
                if a.per_pool:
                    runs[s].append(pools)
                met = float((pools["prefill"][0] & pools["decode"][0]).mean())
                gpu_h = sum(g for _, g in pools.values())
                scores[s].append((met, gpu_h, gpu_h / base["gpu_h"], gpu_h / everywhere))
            meeting = [(scores[s][-1][1], s) for s in settings if scores[s][-1][0] >= 0.99]
            if meeting:
                _, s = min(meeting)
                slo, _, vs_day, vs_all = scores[s][-1]
                print(
                    f"{kind:8} {seed:>4}: cheapest meeting 99%: {_label(s)}: "
                    f"{slo:.2%}, x{vs_day:.2f} the day's fixed size, x{vs_all:.2f} fixed/all"
                )
            else:
                best = max(scores[s][-1][0] for s in settings)
                print(f"{kind:8} {seed:>4}: no setting meets 99% (best {best:.2%})")
        everywhere_ok = [(sum(x[1] for x in v), s) for s, v in scores.items() if min(x[0] for x in v) >= 0.99]
        if everywhere_ok:
            _, s = min(everywhere_ok)
            v = scores[s]
            print(
                f"{kind:8}  all: one setting for every seed: {_label(s)}: "
                f"{min(x[0] for x in v):.2%}-{max(x[0] for x in v):.2%}, "
                f"x{min(x[2] for x in v):.2f}-{max(x[2] for x in v):.2f} the day's fixed size, "
                f"x{min(x[3] for x in v):.2f}-{max(x[3] for x in v):.2f} fixed/all "
                f"({time.perf_counter() - t0:.0f} s)"
            )
        else:
            print(f"{kind:8}  all: no one setting meets 99% on every seed ({time.perf_counter() - t0:.0f} s)")
        if a.per_pool:
            print(f"{kind:8}  per pool: {per_pool(runs, bases)}")


if __name__ == "__main__":
    main()
