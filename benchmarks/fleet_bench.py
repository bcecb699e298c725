"""Fleet benchmark: what one refresh of the expert-placement control loop costs as the fleet grows.

N engine instances of DeepSeek-V3 shape (61 layers, 58 of them MoE, 256 experts + 32 redundant,
8 groups), in pools of --pool-size instances, EP72 by default (--mix EP32:1,EP72:2,EP144:1 for
a mix). Each instance's runtime is simulated in process: its windows are the runtime's own
records (moe_runtime.sidecar.state.Window) serialised exactly as GET /v1/windows answers (binary, as
the operator asks since moe_contract.windows_wire; --wire json: as older runtimes answer), with a
new window per refresh and the newest one's 32 step samples. The operator side is the control
loop's own code, per pool, in the order the loop runs it:

    collect  windows_wire.decode (or json.loads) + control.windows.parse_windows + History.add
    store    control.history_store snapshot + encode (the ConfigMap it applies)
    plan     control.instances.evaluate_instances (every instance planned, decided, pool plan)
    check    instead of plan, with --planning runtimes: the same evaluation with each instance's map
             proposed by its runtime, the operator checking and scoring each on its own windows
             (and planning the pool's own map when anything publishes)
    push     moe_placement.document.render + the JSON body of each PUT /v1/placement

Printed per fleet size: the refresh's CPU seconds by phase, the share of one 5-minute interval
one core spends, peak resident memory (each size runs in a fresh process), bytes received and
sent, and the time from the newest window to its pushed placement for the last pool served: the
loop evaluates every pool in one interpreter, so that pool waits for all of the operator's CPU of
the refresh (counted in CPU seconds, the machine being shared), plus, with --planning runtimes,
one runtime's plan (they plan at once, each in its own pod).

Planning is by far the largest phase and grows with instances, one plan each; so that a run
stays short, --plan-sample K plans K instances per pool and scales the plan phase by
pool-size / K (the printed "plan*" rows say so). Traffic: moe_placement.regimes' synthetic
decode trace, 4 replicas with router affinity 0.3, each instance one replica's trace scaled by
its own factor; the cost does not depend on the traffic beyond its shape.

    .venv/bin/python benchmarks/fleet_bench.py [--sizes 10,50,200,500] [--pool-size 50]
        [--mix EP72:1] [--plan-sample 2] [--history 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per planning process
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

from moe_contract import windows_wire
from moe_operator.control import history_store
from moe_operator.control.evaluate import Policy, PoolShape
from moe_operator.control.instances import _pool_plan, evaluate_instances, histories, newest_fresh
from moe_operator.control.windows import History, parse_windows
from moe_placement import document, plan_instances
from moe_placement.bench import STEP_SAMPLES
from moe_placement.maps import trivial_map
from moe_placement.regimes import SETUPS, synthetic_counts
from moe_runtime.exchange import WindowRecord
from moe_runtime.sidecar.state import Window as RuntimeWindow

LAYERS, DENSE = 61, 3  # DeepSeek-V3: the first 3 layers are dense (zero rows in the windows)
WINDOW_STEPS = 64  # engine passes per load window
REFRESH_S = 300.0  # spec.eplb.refreshInterval's default
REPLICAS = 4  # distinct traffic traces per setup (router affinity 0.3)
TOP_K = 8
PHASES = ("collect", "store", "plan", "check", "push")


@dataclass
class PoolSim:
    """One pool's simulated runtimes and the operator's memory of it."""

    name: str
    setup: str
    shape: PoolShape
    instances: list[str]
    scale: dict[str, float]
    history: History = field(default_factory=History)
    seq: dict[str, int] = field(default_factory=dict)
    current: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Trace:
    """One replica's windows as a runtime records them: sums [W, 61, 256] and step samples
    [W, 32, 61, 256] (3 dense rows of zeros first); the per-step trace itself is not kept."""

    sums: np.ndarray
    steps: np.ndarray


def traces(setup: str, windows: int) -> list[Trace]:
    out = []
    for r in range(REPLICAS):
        moe = synthetic_counts(
            SETUPS[setup], "slow", window=WINDOW_STEPS, steps=windows * WINDOW_STEPS, layers=LAYERS - DENSE,
            seed=0, replica=r, affinity=0.3,
        )  # fmt: skip
        full = np.zeros((moe.shape[0], LAYERS, moe.shape[2]), dtype=np.int32)
        full[:, DENSE:] = moe
        del moe
        sums = full.reshape(windows, WINDOW_STEPS, LAYERS, -1).sum(axis=1, dtype=np.int64)
        picks = np.linspace(0, WINDOW_STEPS - 1, STEP_SAMPLES).astype(int)
        steps = np.stack([full[w * WINDOW_STEPS + picks] for w in range(windows)])
        out.append(Trace(sums, steps))
    return out


def answer(trace: Trace, index: int, seq: int, ended_at: float, scale: float, wire: str) -> bytes:
    """GET /v1/windows?after=&counts=true&steps=true as the runtime answers it: one new window, in
    the binary encoding the operator asks for (moe_contract.windows_wire) or as JSON."""
    record = WindowRecord(
        counts=np.rint(trace.sums[index] * scale).astype(np.int64),
        passes=WINDOW_STEPS,
        started_at=ended_at - 30.0,
        ended_at=ended_at,
        steps=np.rint(trace.steps[index] * scale).astype(np.int64),
    )
    window = RuntimeWindow(seq, record, "operator", 1)
    if wire == "binary":
        return windows_wire.encode([window.to_wire(steps=True)], seq, ended_at)
    doc = window.to_json(TOP_K, counts=True, steps=True)
    return json.dumps({"windows": [doc], "latest_seq": seq, "now": ended_at}).encode()


def read(body: bytes, wire: str) -> dict[str, Any]:
    """What RuntimeClient.windows hands the loop (decoded, not yet judged)."""
    return windows_wire.decode(body) if wire == "binary" else dict(json.loads(body))


def make_pools(sizes: int, pool_size: int, mix: list[tuple[str, int]]) -> list[PoolSim]:
    """``sizes`` instances split into pools of at most pool_size, setups in the mix's proportions."""
    weights = np.array([w for _, w in mix], dtype=float)
    per_setup = np.floor(sizes * weights / weights.sum()).astype(int)
    per_setup[0] += sizes - per_setup.sum()
    pools: list[PoolSim] = []
    rng = np.random.default_rng(7)
    for (setup, _), count in zip(mix, per_setup, strict=True):
        s = SETUPS[setup]
        shape = PoolShape(
            LAYERS, s.num_experts, s.num_redundant, s.num_gpus, s.num_nodes, s.num_groups, "static"
        )
        for start in range(0, int(count), pool_size):
            names = [f"{setup.lower()}-{len(pools)}-{i}" for i in range(min(pool_size, int(count) - start))]
            scale = {n: float(rng.lognormal(0.0, 0.2)) for n in names}
            pools.append(PoolSim(f"{setup}-{len(pools)}", setup, shape, names, scale))
    return pools


def refresh(
    pool: PoolSim,
    data: list[Trace],
    index: int,
    now: float,
    sample: int,
    timers: dict[str, float],
    wire: str,
    planning: str,
) -> tuple[int, int]:
    """One evaluation of one pool (every instance delivers window ``index``); returns bytes in, out."""
    answers = {
        n: answer(data[i % REPLICAS], index, index + 1, now - 1.0, pool.scale[n], wire)
        for i, n in enumerate(pool.instances)
    }
    key = pool.shape.num_layers, pool.shape.num_experts

    def collect() -> None:
        for name, body in answers.items():
            pool.history.add(parse_windows(f"{name}/uid", read(body, wire), key, now=now))

    _timed(timers, "collect", collect)
    policy = Policy("operator", 0.0, 0, 0.0, REFRESH_S / 4)

    def store() -> None:
        snap = history_store.snapshot(list(pool.history.windows), policy.bucket_s, pool.history.cursors, now)
        if snap is not None:
            history_store.encode(snap)

    _timed(timers, "store", store)
    live = trivial_map(pool.shape.num_layers, pool.shape.num_experts, pool.shape.num_slots)
    targets: dict[str, np.ndarray] = {}
    if planning == "runtimes":
        _timed(timers, "check", lambda: targets.update(check_proposals(pool, live, now)))
    else:
        targets = plan_pool(pool, live, now, sample, timers)
    sent = 0

    def push() -> None:
        nonlocal sent
        stamp = time.gmtime(now)
        for name in pool.instances:
            phy2log = targets.get(name, pool.current.get(name, live))
            pool.current[name] = phy2log
            doc = document.render(index + 1, phy2log, _dt(stamp))
            sent += len(json.dumps(doc).encode())

    _timed(timers, "push", push)
    return sum(len(b) for b in answers.values()), sent


def plan_pool(
    pool: PoolSim, live: np.ndarray, now: float, sample: int, timers: dict[str, float]
) -> dict[str, np.ndarray]:
    """The loop's own evaluation (the plan phase); each instance's map to push."""
    policy = Policy("operator", 0.0, 0, 0.0, REFRESH_S / 4)
    planned = pool.instances[:sample] if sample else pool.instances
    currents = {n: pool.current.get(n, live) for n in planned}
    ev = _timed(
        timers, "plan",
        lambda: evaluate_instances(list(pool.history.windows), currents, live, pool.shape, policy,
                                   dict.fromkeys(currents), now - 2 * REFRESH_S),
    )  # fmt: skip
    if sample and len(planned) < len(pool.instances):  # scale the instances' plans, not the pool's
        pool_plan = 0.0
        if ev.publish:
            _, pooled, _ = histories(list(pool.history.windows), planned, policy.bucket_s)
            started = time.process_time()
            _pool_plan(pooled, live, pool.shape, policy)
            pool_plan = time.process_time() - started
            global UNTIMED  # measured to scale the sample, not a cost of the loop
            UNTIMED += pool_plan
        per_instance = max(0.0, timers.pop("_last") - pool_plan) / len(planned)
        timers["plan"] += per_instance * (len(pool.instances) - len(planned))
    return {name: r.target for name, r in ev.results.items()}


def check_proposals(pool: PoolSim, live: np.ndarray, now: float) -> dict[str, np.ndarray]:
    """--planning runtimes: the loop's evaluation with every instance's map proposed by its runtime
    (control.instances.evaluate_instances with proposals: each checked and scored on the operator's
    own windows, and the pool's own plan when anything publishes). The proposals (the runtimes'
    work) are made untimed: one real plan per pool stands for every instance's, which the check
    scores against each instance's own windows all the same."""
    policy = Policy("operator", 0.0, 0, 0.0, REFRESH_S / 4)
    windows = list(pool.history.windows)
    started = time.process_time()
    _, pooled, own = histories(windows, [pool.instances[0]], policy.bucket_s)
    newest = newest_fresh(windows, now - 2 * REFRESH_S)[pool.instances[0]]
    shape = pool.shape
    proposal = plan_instances(own, num_gpus=shape.num_gpus, num_nodes=shape.num_nodes,
                              num_redundant=shape.num_redundant, num_groups=shape.num_groups, pool=pooled,
                              steps={pool.instances[0]: newest.steps})[pool.instances[0]].physical_to_logical_map  # fmt: skip
    global UNTIMED, RUNTIME_PLAN_S  # the runtimes' share, taken out of the operator's phase
    UNTIMED += time.process_time() - started
    RUNTIME_PLAN_S = max(RUNTIME_PLAN_S, time.process_time() - started)
    currents = {n: pool.current.get(n, live) for n in pool.instances}
    ev = evaluate_instances(windows, currents, live, shape, policy, dict.fromkeys(currents), now - 2 * REFRESH_S,
                            dict.fromkeys(pool.instances, proposal))  # fmt: skip
    return {name: r.target for name, r in ev.results.items()}


UNTIMED = 0.0
RUNTIME_PLAN_S = 0.0  # one runtime's plan (the runtimes plan at once, each on its own pod)


def _proc_mb(field_name: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _dt(stamp: time.struct_time) -> Any:
    from datetime import UTC, datetime

    return datetime(*stamp[:6], tzinfo=UTC)


def _timed(timers: dict[str, float], phase: str, fn: Callable[[], Any]) -> Any:
    started = time.process_time()
    out = fn()
    spent = time.process_time() - started
    timers[phase] = timers.get(phase, 0.0) + spent
    timers["_last"] = spent
    return out


def save_traces(cache: Path, setup: str, windows: int) -> None:
    """Made once per run in the parent, so no child's peak memory holds their generation."""
    arrays = {}
    for r, t in enumerate(traces(setup, windows)):
        arrays[f"sums{r}"], arrays[f"steps{r}"] = t.sums, t.steps
    np.savez(cache / f"{setup}.npz", **arrays)  # type: ignore[arg-type]


def load_traces(cache: Path, setup: str) -> list[Trace]:
    with np.load(cache / f"{setup}.npz") as f:
        return [Trace(f[f"sums{r}"], f[f"steps{r}"]) for r in range(REPLICAS)]


def run_size(
    size: int,
    pool_size: int,
    mix: list[tuple[str, int]],
    sample: int,
    history: int,
    cache: Path,
    wire: str,
    planning: str,
) -> dict[str, Any]:
    """Fill every pool's history (untimed), then time one refresh of the whole fleet."""
    pools = make_pools(size, pool_size, mix)
    data = {s: load_traces(cache, s) for s, _ in mix}
    sim_mb = _proc_mb("VmRSS")  # the simulated runtimes' data, before any operator code runs
    now = 1_900_000_000.0
    for index in range(history - 1):  # warm up: the loop's memory after history - 1 refreshes
        t = now - (history - index) * REFRESH_S
        for pool in pools:
            for i, name in enumerate(pool.instances):
                body = answer(
                    data[pool.setup][i % REPLICAS], index, index + 1, t - 1.0, pool.scale[name], wire
                )
                pool.history.add(parse_windows(f"{name}/uid", read(body, wire), (LAYERS, 256), now=t))
    timers: dict[str, float] = {}
    received = sent = 0
    for pool in pools:
        r, s = refresh(pool, data[pool.setup], history - 1, now, sample, timers, wire, planning)
        received, sent = received + r, sent + s
    timers.pop("_last", None)
    if "check" in timers:
        timers["check"] -= UNTIMED
    cpu = sum(timers.values())
    return {
        "size": size,
        "pools": len(pools),
        "timers": timers,
        "cpu": cpu,
        # the pools share one interpreter, so the last pool's map goes out after all of the
        # operator's CPU (in CPU seconds: the machine is shared); the runtimes plan at once
        "wall": cpu + RUNTIME_PLAN_S,
        "rss_mb": _proc_mb("VmHWM") - sim_mb,
        "received_mb": received / 2**20,
        "sent_mb": sent / 2**20,
        "history_windows": sum(len(p.history.windows) for p in pools),
        "sampled": bool(sample) and sample < pool_size,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,50,200,500")
    parser.add_argument(
        "--pool-size", type=int, default=50, help="instances per pool (one MoEDeployment pool)"
    )
    parser.add_argument("--mix", default="EP72:1", help="setups and weights, e.g. EP32:1,EP72:2,EP144:1")
    parser.add_argument(
        "--plan-sample", type=int, default=2,
        help="instances planned per pool, the plan phase scaled to the pool (0: plan every instance)",
    )  # fmt: skip
    parser.add_argument("--history", type=int, default=8, help="windows each instance has delivered")
    parser.add_argument(
        "--wire", choices=["binary", "json"], default="binary",
        help="how runtimes answer /v1/windows: the binary encoding the operator asks for, or JSON (older runtimes)",
    )  # fmt: skip
    parser.add_argument(
        "--planning", choices=["operator", "runtimes"], default="operator",
        help="as moe-operator run --planning: operator (the loop plans every instance) or runtimes (each "
        "runtime plans its own, untimed here; the operator checks and scores the proposals)",
    )  # fmt: skip
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)  # internal: one size, JSON out
    parser.add_argument("--cache", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    mix = [(m.split(":")[0], int(m.split(":")[1])) for m in args.mix.split(",")]
    if args.one:
        r = run_size(
            args.one,
            args.pool_size,
            mix,
            args.plan_sample,
            args.history,
            args.cache,
            args.wire,
            args.planning,
        )
        print(json.dumps(r))
        return 0
    cache = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    for setup, _ in mix:
        save_traces(cache, setup, args.history + 1)
    print(f"fleet benchmark: V3 shape, {args.mix}, pools of {args.pool_size}, windows as {args.wire}, "
          f"planning in the {args.planning}, one refresh after "
          f"{args.history} windows per instance; CPU seconds on this machine (one process, one core)")  # fmt: skip
    head = "".join(f"{p:>8} " for p in PHASES)
    print(f"{'N':>5} {'pools':>5} {head}{'CPU s':>8} {'core@5min':>9} {'win->push':>9} {'op MB':>7} "
          f"{'in MB':>7} {'out MB':>7} {'windows':>7}")  # fmt: skip
    rows = []
    for size in (int(x) for x in args.sizes.split(",")):
        cmd = [sys.executable, __file__, "--one", str(size), "--pool-size", str(args.pool_size), "--mix",
               args.mix, "--plan-sample", str(args.plan_sample), "--history", str(args.history),
               "--cache", str(cache), "--wire", args.wire, "--planning", args.planning]  # fmt: skip
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        rows.append(r)
        mark = "*" if r["sampled"] and args.planning == "operator" else " "
        phases = "".join(f"{r['timers'].get(p, 0.0):>8.1f}{mark if p == 'plan' else ' '}" for p in PHASES)
        print(
            f"{r['size']:>5} {r['pools']:>5} {phases}{r['cpu']:>8.1f} {r['cpu'] / REFRESH_S:>9.2f} "
            f"{r['wall']:>8.0f}s {r['rss_mb']:>7.0f} {r['received_mb']:>7.0f} {r['sent_mb']:>7.1f} "
            f"{r['history_windows']:>7}",
            flush=True,
        )
    if args.planning == "operator" and any(r["sampled"] for r in rows):
        print(f"* plan: {args.plan_sample} instance(s) per pool planned, scaled to the pool's size")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"growth {a['size']} -> {b['size']} instances ({b['size'] / a['size']:.0f}x): CPU "
              f"{b['cpu'] / a['cpu']:.1f}x, memory {b['rss_mb'] / a['rss_mb']:.1f}x")  # fmt: skip
    shutil.rmtree(cache, ignore_errors=True)
    print("targets (issue 29): 500 EP72 instances per 5-minute refresh at <= 1 core and <= 2 GiB; "
          "window -> push < 60 s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
