"""Planning time per instance at DeepSeek-V3 shape: this checkout against a baseline revision, one run.

The inputs are what the operator's control loop gives ``plan_instances`` (control/instances.py):
per instance its own ``HISTORY`` (8) window sums, ``STEP_SAMPLES`` (32) single steps from its
newest window, the map it holds as ``current``, the pool's windows as the prior, static
dispatch and no move cap (the CRD defaults; ``--max-moves N`` caps each instance's moves, as
``spec.eplb.maxMovesPerRefresh`` does). Traffic: the synthetic regime ``--regime``
(regimes.py) at 58 MoE layers, one batch stream per instance; the map each instance holds is
DeepSeek EPLB on its previous window (what its engine would run). Deployments: the V3
setups of regimes.py (256 experts + 32 redundant, 8 groups): EP32 (4 nodes, 9 slots per GPU,
hierarchical), EP72, EP144, EP288 (global; 4, 2, 1 slots per GPU).

Both planners run in their own subprocess (numpy on one thread), fed the same inputs, and are
timed alternately on every case, so load on a shared machine hits both alike; DeepSeek EPLB
(baseline.py) on each instance's last window is timed in the same processes. Printed per case:
median wall seconds per instance over ``--repeats`` calls of plan_instances (``cpu s``: its
CPU seconds, less sensitive to other load), EPLB's, the ratios, whether every instance's plan
(map, moved slots, forecast rule) is identical, and the future imbalance of each plan (excess = mean over the next window's steps and layers of
max/mean GPU load - 1, as bench.py scores) over EPLB's on the same steps. Usage:

    PYTHONPATH=placement:operator .venv/bin/python benchmarks/planner_speed.py \\
        [--baseline-rev main | --baseline-path DIR | --baseline-rev none] \\
        [--setups EP32,EP72,EP144,EP288] [--seeds 1,201] [--regime slow] [--instances 2] [--repeats 3] \\
        [--max-moves N]

``--baseline-rev`` exports ``placement/moe_placement`` of that git revision into a temporary
directory; ``--baseline-path`` is a directory holding a ``moe_placement`` package (e.g.
/work/main/placement). Seeds: 1 was looked at while the planner was made faster, 201 was not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy is imported: one core per planner

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WINDOW = 64  # steps per rebalance window (report.WINDOW)
LAYERS = 58  # DeepSeek-V3's MoE layers
V3_SETUPS = ("EP32", "EP72", "EP144", "EP288")


@dataclass(frozen=True)
class Case:
    """One deployment and seed: the inputs of every instance and the steps each plan is scored on."""

    setup: str
    seed: int
    path: Path  # .npz with the planner inputs (read by the workers)
    future: dict[str, np.ndarray]  # per instance, the next window's steps [W, L, E]


def build_case(setup_name: str, seed: int, regime: str, instances: int, folder: Path) -> Case:
    """Traces for every instance, cut as the control loop and bench.py cut them."""
    from moe_placement.baseline import baseline_plan
    from moe_placement.bench import HISTORY, step_samples, window_sums
    from moe_placement.regimes import SETUPS, synthetic_counts

    setup = SETUPS[setup_name]
    now = (HISTORY + 1) * WINDOW  # one window more than held: the first map held is EPLB on it
    arrays: dict[str, Any] = {}
    future = {}
    for r in range(instances):
        counts = synthetic_counts(
            setup, regime, window=WINDOW, steps=now + WINDOW, layers=LAYERS, seed=seed, replica=r
        )
        arrays[f"history/r{r}"] = window_sums(counts, now, WINDOW)
        arrays[f"steps/r{r}"] = step_samples(counts, now - WINDOW, WINDOW)
        previous = window_sums(counts, now - WINDOW, WINDOW, count=1)[-1]
        arrays[f"current/r{r}"] = baseline_plan(previous, **setup.shape())
        future[f"r{r}"] = counts[now : now + WINDOW]
    shape = setup.shape()
    arrays["shape"] = np.array(
        [shape["num_gpus"], shape["num_nodes"], shape["num_redundant"], shape["num_groups"]]
    )
    path = folder / f"{setup_name}-{seed}.npz"
    np.savez(path, **arrays)
    return Case(setup_name, seed, path, future)


# --- worker: runs in a subprocess with one planner's moe_placement on its path --------------------


def worker(dispatch: str, max_moves: int | None) -> None:
    """Read case paths from stdin; plan every instance, time it, write the maps; answer one JSON line."""
    from moe_placement import baseline_plan, plan_instances

    warm = False
    for line in sys.stdin:
        job = json.loads(line)
        data = np.load(job["case"])
        gpus, nodes, redundant, groups = (int(v) for v in data["shape"])
        shape = {"num_gpus": gpus, "num_nodes": nodes, "num_redundant": redundant, "num_groups": groups}
        names = sorted(k.split("/")[1] for k in data.files if k.startswith("history/"))
        history = {n: data[f"history/{n}"] for n in names}
        pool = np.sum(list(history.values()), axis=0)
        inputs = {
            "pool": pool,
            "steps": {n: data[f"steps/{n}"] for n in names},
            "currents": {n: data[f"current/{n}"] for n in names},
        }
        if not warm:  # the first call loads (or compiles) the search kernel: not a plan's cost
            plan_instances(
                {names[0]: history[names[0]]}, dispatch=dispatch, max_moves=max_moves, **inputs, **shape
            )
            warm = True
        started, cpu = time.perf_counter(), time.process_time()
        plans = plan_instances(history, dispatch=dispatch, max_moves=max_moves, **inputs, **shape)
        ours = (time.perf_counter() - started) / len(names)
        ours_cpu = (time.process_time() - cpu) / len(names)
        started = time.perf_counter()
        for n in names:
            baseline_plan(history[n][-1], **shape)
        eplb = (time.perf_counter() - started) / len(names)
        out: dict[str, Any] = {f"map/{n}": p.physical_to_logical_map for n, p in plans.items()}
        out.update({f"moved/{n}": np.array(p.moved_slots) for n, p in plans.items()})
        np.savez(job["out"], **out)
        rules = {n: p.forecast_rule for n, p in plans.items()}
        print(json.dumps({"ours": ours, "cpu": ours_cpu, "eplb": eplb, "rules": rules}), flush=True)


class Worker:
    """A persistent subprocess planning with the moe_placement package found in ``root``."""

    def __init__(self, root: Path, dispatch: str, max_moves: int | None) -> None:
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--dispatch", dispatch]
            + ([] if max_moves is None else ["--max-moves", str(max_moves)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def run(self, case: Case, out: Path) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"case": str(case.path), "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"worker died on {case.setup} seed {case.seed}")
        result: dict[str, Any] = json.loads(answer)
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def export_revision(rev: str, folder: Path) -> Path:
    """placement/moe_placement at ``rev`` (git archive) under folder; returns the import root."""
    archive = folder / "baseline.tar"
    with archive.open("wb") as fh:
        subprocess.run(
            ["git", "-C", str(REPO), "archive", rev, "placement/moe_placement"], stdout=fh, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "baseline", filter="data")
    return folder / "baseline" / "placement"


def excess(phy2log: np.ndarray, steps: np.ndarray, case: Case, dispatch: str) -> float:
    """bench.py's score of one map on its next window: mean over steps and layers of max/mean - 1."""
    from moe_placement.metrics import gpu_loads, imbalance
    from moe_placement.regimes import SETUPS

    setup = SETUPS[case.setup]
    load = gpu_loads(phy2log, steps, setup.num_gpus, dispatch, setup.num_nodes)
    return float(imbalance(load).mean() - 1.0)


def quality(out: Path, case: Case, dispatch: str) -> tuple[dict[str, np.ndarray], float]:
    """The maps in a worker's answer and their mean excess over EPLB's (on the same instance's steps)."""
    from moe_placement.baseline import baseline_plan
    from moe_placement.regimes import SETUPS

    data = np.load(out)
    inputs = np.load(case.path)
    maps = {n: data[f"map/{n}"] for n in case.future}
    ratios = []
    for n, steps in case.future.items():
        eplb = baseline_plan(inputs[f"history/{n}"][-1], **SETUPS[case.setup].shape())
        ratios.append(excess(maps[n], steps, case, dispatch) / excess(eplb, steps, case, dispatch))
    return {**maps, **{f"moved/{n}": data[f"moved/{n}"] for n in case.future}}, float(np.mean(ratios))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setups", default=",".join(V3_SETUPS))
    parser.add_argument("--seeds", default="1,201", help="1: looked at while developing; 201: not")
    parser.add_argument("--regime", default="slow")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dispatch", choices=("static", "dynamic"), default="static")
    parser.add_argument("--max-moves", type=int, help="each instance's move cap (default: none)")
    parser.add_argument("--baseline-rev", default="main", help="git revision to compare with ('none': skip)")
    parser.add_argument("--baseline-path", type=Path, help="directory holding a moe_placement package")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.dispatch, args.max_moves)
        return 0
    sys.path.insert(0, str(REPO / "placement"))
    with tempfile.TemporaryDirectory(prefix="planner-speed-") as tmp:
        folder = Path(tmp)
        roots = {"new": REPO / "placement"}
        if args.baseline_path is not None:
            roots["base"] = args.baseline_path
        elif args.baseline_rev != "none":
            roots["base"] = export_revision(args.baseline_rev, folder)
        setups = [s for s in args.setups.split(",") if s]
        seeds = [int(s) for s in args.seeds.split(",") if s]
        started = time.perf_counter()
        cases = [build_case(s, seed, args.regime, args.instances, folder) for s in setups for seed in seeds]
        print(
            f"inputs: {len(cases)} cases, {args.instances} instances each, regime {args.regime}, "
            f"{args.dispatch} dispatch, move cap {args.max_moves} ({time.perf_counter() - started:.0f} s); baseline: "
            f"{args.baseline_path or args.baseline_rev}; planner from {roots['new']}",
            flush=True,
        )
        workers = {k: Worker(root, args.dispatch, args.max_moves) for k, root in roots.items()}
        times: dict[tuple[str, int, str], list[float]] = {}
        answers: dict[tuple[str, int, str], dict[str, Any]] = {}
        for rep in range(args.repeats):
            for case in cases:
                order = list(workers) if rep % 2 == 0 else list(workers)[::-1]
                for name in order:
                    got = workers[name].run(case, folder / f"{name}-{case.setup}-{case.seed}.npz")
                    times.setdefault((case.setup, case.seed, name), []).append(got["ours"])
                    times.setdefault((case.setup, case.seed, f"cpu-{name}"), []).append(got["cpu"])
                    times.setdefault((case.setup, case.seed, f"eplb-{name}"), []).append(got["eplb"])
                    answers[(case.setup, case.seed, name)] = got
        for w in workers.values():
            w.close()
        head = f"{'setup':6} {'seed':>4} | {'new s':>7} {'cpu s':>6} {'EPLB ms':>7} {'new/EPLB':>8}"
        if "base" in workers:
            head += (
                f" | {'base s':>7} {'cpu s':>6} {'EPLB ms':>7} {'base/EPLB':>9} | {'base/new':>8} {'same':>4}"
            )
        head += " | excess/EPLB new" + (" base" if "base" in workers else "")
        print(head)
        for case in cases:
            key = (case.setup, case.seed)
            new_s = float(np.median(times[(*key, "new")]))
            new_c = float(np.median(times[(*key, "cpu-new")]))
            new_e = float(np.median(times[(*key, "eplb-new")]))
            maps_new, q_new = quality(folder / f"new-{case.setup}-{case.seed}.npz", case, args.dispatch)
            line = f"{case.setup:6} {case.seed:>4} | {new_s:7.3f} {new_c:6.3f} {1000 * new_e:7.1f} {new_s / new_e:8.0f}"
            tail = f" | {q_new:.4f}"
            if "base" in workers:
                base_s = float(np.median(times[(*key, "base")]))
                base_c = float(np.median(times[(*key, "cpu-base")]))
                base_e = float(np.median(times[(*key, "eplb-base")]))
                maps_base, q_base = quality(
                    folder / f"base-{case.setup}-{case.seed}.npz", case, args.dispatch
                )
                same = all(np.array_equal(maps_new[k], maps_base[k]) for k in maps_new) and (
                    answers[(*key, "new")]["rules"] == answers[(*key, "base")]["rules"]
                )
                line += (
                    f" | {base_s:7.3f} {base_c:6.3f} {1000 * base_e:7.1f} {base_s / base_e:9.0f} |"
                    f" {base_s / new_s:8.2f} {'yes' if same else 'NO':>4}"
                )
                tail += f" {q_base:.4f}"
            print(line + tail, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
