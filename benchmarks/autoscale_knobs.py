"""Does any setting of the autoscaler's knobs meet the SLO on a trace for less than the fixed size?

``autoscale_bench.py`` scores the defaults and ``burstReserve: 150``. This sweeps the two knobs
that buy capacity ahead of a burst, ``targetUtilization`` (spare capacity as a share of the
load, told in advance) and ``burstReserve`` (spare capacity as a multiple of the largest rise
remembered, learned), over the same simulator and traces, and prints per trace and seed the
setting with the fewest GPU-hours that meets the SLO in 99% of intervals, as a ratio to the
fixed size chosen in hindsight on that very trace (``fixed``) and to the one fixed size that
meets 99% on every trace of the kind in the run (``fixed/all``); then the one setting that
meets 99% on every trace and seed, with the fewest GPU-hours in all. A ratio above 1.00 in the
first column means no setting swept beats that day's hindsight size. Usage:

    .venv/bin/python benchmarks/autoscale_knobs.py [--traces bursty,flash] [--seeds 0,1,2,3]

About a second per setting, trace and seed on one core (54 settings).
"""

from __future__ import annotations

import argparse
import time

from autoscale_bench import fixed, fixed_size, run, slo_controller, trace

UTILIZATION = (50, 55, 60, 65, 70, 75, 80, 85, 90)  # percent: targetUtilization
RESERVE = (0, 50, 100, 150, 200, 300)  # percent: burstReserve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default="bursty,flash")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--boot", type=float, default=300.0)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    settings = [(u, r) for u in UTILIZATION for r in RESERVE]
    print(f"targetUtilization {UTILIZATION} x burstReserve {RESERVE}; boot {a.boot:g}s; prior x0.7")
    for kind in a.traces.split(","):
        t0 = time.perf_counter()
        lams = {seed: trace(kind, seed, a.hours) for seed in seeds}
        every = fixed_size(list(lams.values()))
        scores: dict[tuple[int, int], list[tuple[float, float, float, float]]] = {s: [] for s in settings}
        for seed, lam in lams.items():
            base, size = fixed(lam, a.boot, seed)
            everywhere = run(lam, every, None, a.boot, seed)["gpu_h"]
            for u, r in settings:
                ctl = slo_controller(0.7, a.boot, reserve=r / 100, headroom=u / 100)
                res = run(lam, dict(size), ctl, a.boot, seed)
                scores[u, r].append(
                    (res["slo"], res["gpu_h"], res["gpu_h"] / base["gpu_h"], res["gpu_h"] / everywhere)
                )
            meeting = [(scores[s][-1][1], s) for s in settings if scores[s][-1][0] >= 0.99]
            if meeting:
                _, (u, r) = min(meeting)
                slo, _, vs_day, vs_all = scores[u, r][-1]
                print(
                    f"{kind:8} {seed:>4}: cheapest meeting 99%: targetUtilization {u} burstReserve {r}: "
                    f"{slo:.2%}, x{vs_day:.2f} the day's fixed size, x{vs_all:.2f} fixed/all"
                )
            else:
                best = max(scores[s][-1][0] for s in settings)
                print(f"{kind:8} {seed:>4}: no setting meets 99% (best {best:.2%})")
        everywhere_ok = [(sum(x[1] for x in v), s) for s, v in scores.items() if min(x[0] for x in v) >= 0.99]
        if everywhere_ok:
            _, (u, r) = min(everywhere_ok)
            v = scores[u, r]
            print(
                f"{kind:8}  all: one setting for every seed: targetUtilization {u} burstReserve {r}: "
                f"{min(x[0] for x in v):.2%}-{max(x[0] for x in v):.2%}, "
                f"x{min(x[2] for x in v):.2f}-{max(x[2] for x in v):.2f} the day's fixed size, "
                f"x{min(x[3] for x in v):.2f}-{max(x[3] for x in v):.2f} fixed/all "
                f"({time.perf_counter() - t0:.0f} s)"
            )
        else:
            print(f"{kind:8}  all: no one setting meets 99% on every seed ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
