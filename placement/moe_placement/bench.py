"""Side-by-side benchmark: the planner against DeepSeek's EPLB as engines run it, on future traffic.

Protocol (every suite): a trace of per-step expert counts is cut into rebalance windows.
At each rebalance point the planner holds what the operator holds: the sums of the last
``HISTORY`` windows, and, in the default mode, ``STEP_SAMPLES`` single steps sampled evenly
from the last window (``--inputs windows`` drops them: what the runtime exports today).
The baseline is DeepSeek EPLB on the last window's sum, as SGLang runs it. Every map is
scored on each step of the window after it: excess = mean over steps and layers of
max/mean GPU load - 1 (SGLang's balancedness is its inverse), dynamic dispatch unless told.

Columns: ratio = ours / baseline excess; oracle = the same planner fitted on the window it
is scored on (its sum and its step samples); captured = share of the oracle's gain over
the baseline that ours gets; packing = the packer alone (copies and placement hedged on
the scored window's step samples, no forecast and no hedging test) against the baseline
fitted on the same window; @25% = ours from its previous
map with at most a quarter of the baseline's moves at that rebalance; moves count expert
copies a GPU must load.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .baseline import baseline_plan
from .forecast import shares
from .fresh import place_rows
from .instances import plan_instances
from .layout import FloatArray, IntArray, Layout, make_layout
from .metrics import gpu_loads, gpu_moves, imbalance
from .planner import Plan, plan
from .regimes import SETUPS, Setup

HISTORY = 8  # windows the planner holds (the baseline uses the last one)
SCORED = 8  # rebalances scored per case
STEP_SAMPLES = 32  # single steps sampled from the last window
MOVE_SHARE = 0.25  # move cap of the incremental plans: this share of the baseline's moves


@dataclass(frozen=True)
class Score:
    """Future imbalance and movement of one planner over a case."""

    excess: float  # mean over steps and layers of max/mean - 1
    p95: float  # 95th percentile of per-step, per-layer max/mean
    moves: tuple[int, ...]  # expert copies loaded at each rebalance (0 for the first)

    @property
    def moved(self) -> int:
        return int(sum(self.moves))


def rebalance_points(num_steps: int, window: int) -> list[int]:
    """Plans are made after HISTORY windows, then every window while a full window follows."""
    return list(range(HISTORY * window, num_steps - window + 1, window))


def window_sums(counts: FloatArray, end: int, window: int, count: int = HISTORY) -> FloatArray:
    """The sums of the ``count`` windows before ``end``, [count, L, E], oldest first."""
    start = max(0, end - count * window)
    start += (end - start) % window
    out: FloatArray = counts[start:end].reshape(-1, window, *counts.shape[1:]).sum(axis=1)
    return out


def step_samples(counts: FloatArray, start: int, window: int, count: int = STEP_SAMPLES) -> FloatArray:
    """``count`` single steps spread evenly over [start, start + window)."""
    out: FloatArray = counts[start + np.linspace(0, window - 1, min(count, window)).astype(int)]
    return out


def score(
    counts: FloatArray,
    maps: Sequence[IntArray],
    points: Sequence[int],
    window: int,
    setup: Setup,
    dispatch: str,
) -> Score:
    """Each map on every step of the window after its rebalance point."""
    ratios, moves = [], []
    for k, t in enumerate(points):
        load = gpu_loads(maps[k], counts[t : t + window], setup.num_gpus, dispatch, setup.num_nodes)
        ratios.append(imbalance(load).ravel())
        moves.append(0 if k == 0 else gpu_moves(maps[k - 1], maps[k], setup.num_gpus))
    flat = np.concatenate(ratios)
    return Score(float(flat.mean() - 1.0), float(np.percentile(flat, 95)), tuple(moves))


@dataclass(frozen=True)
class Row:
    """One case (deployment, traffic, seed): every planner scored on the same future steps."""

    setup: str
    regime: str
    seed: int
    base: Score
    ours: Score
    capped: Score  # from the previous map, at most MOVE_SHARE of the baseline's moves
    oracle: Score  # ours fitted on the scored window
    base_fit: Score  # the baseline fitted on the scored window
    packed: Score  # the packer alone fitted on the scored window (its mean and step samples)
    plan_ms: float  # ours, fresh, per plan
    capped_ms: float
    base_ms: float
    rules: dict[str, int] = field(default_factory=dict)  # forecast rules the backtests chose


def _timed(loads: FloatArray, **kw: object) -> tuple[Plan, float]:
    started = time.perf_counter()
    out = plan(loads, **kw)  # type: ignore[arg-type]
    return out, 1000 * (time.perf_counter() - started)


def run_case(
    counts: FloatArray,
    window: int,
    setup: Setup,
    *,
    regime: str,
    seed: int,
    dispatch: str = "dynamic",
    inputs: str = "steps",
) -> Row:
    """Baseline, ours fresh, ours move-capped, oracle and both fitted on the scored window."""
    points = rebalance_points(counts.shape[0], window)
    shape = setup.shape()
    maps: dict[str, list[IntArray]] = {
        k: [] for k in ("base", "ours", "capped", "oracle", "base_fit", "packed")
    }
    layout = make_layout(counts.shape[1], counts.shape[2], **shape)
    times: dict[str, list[float]] = {"ours": [], "capped": [], "base": []}
    rules: Counter[str] = Counter()
    for k, t in enumerate(points):
        windows = window_sums(counts, t, window)
        steps = step_samples(counts, t - window, window) if inputs == "steps" else None
        started = time.perf_counter()
        maps["base"].append(baseline_plan(windows[-1], **shape))
        times["base"].append(1000 * (time.perf_counter() - started))
        fresh, ms = _timed(windows, steps=steps, horizon=1, dispatch=dispatch, **shape)
        maps["ours"].append(fresh.physical_to_logical_map)
        times["ours"].append(ms)
        rules[fresh.forecast_rule] += 1
        if k == 0:
            maps["capped"].append(fresh.physical_to_logical_map)
        else:
            cap = int(MOVE_SHARE * gpu_moves(maps["base"][k - 1], maps["base"][k], setup.num_gpus))
            prev = maps["capped"][-1]
            capped, ms = _timed(
                windows, steps=steps, horizon=1, dispatch=dispatch, current=prev, max_moves=cap, **shape
            )
            maps["capped"].append(capped.physical_to_logical_map)
            times["capped"].append(ms)
        scored = counts[t : t + window]
        fit_steps = step_samples(counts, t, window) if inputs == "steps" else None
        maps["oracle"].append(
            plan(scored.sum(axis=0), steps=fit_steps, dispatch=dispatch, **shape).physical_to_logical_map
        )
        maps["base_fit"].append(baseline_plan(scored.sum(axis=0), **shape))
        maps["packed"].append(packer_alone(scored, fit_steps, layout, dispatch))
    scores = {k: score(counts, v, points, window, setup, dispatch) for k, v in maps.items()}
    return Row(
        setup.name,
        regime,
        seed,
        scores["base"],
        scores["ours"],
        scores["capped"],
        scores["oracle"],
        scores["base_fit"],
        scores["packed"],
        float(np.mean(times["ours"])),
        float(np.mean(times["capped"])) if times["capped"] else 0.0,
        float(np.mean(times["base"])),
        dict(rules),
    )


def packer_alone(window: FloatArray, steps: FloatArray | None, layout: Layout, dispatch: str) -> IntArray:
    """Copies and placement fitted on a window itself: its mean share and (if given) its step samples."""
    mean, _ = shares(window.sum(axis=0)[None])
    scen = mean if steps is None else np.concatenate([mean, shares(steps)[0]])
    return place_rows(mean[0], scen.transpose(1, 0, 2), layout, dispatch)


# --- cluster level: several replicas, each its own batch stream of the same traffic --------------


@dataclass(frozen=True)
class ClusterRow:
    """Excess over every replica's next window, per design, and the share of replicas it made worse."""

    setup: str
    regime: str
    seed: int
    replicas: int
    engine: float  # each engine's own EPLB on its own last window
    pool: float  # one operator plan per pool, from all replicas' windows
    instance: float  # one operator plan per replica: own windows, the pool's as a prior
    pool_deepseek: float  # DeepSeek EPLB on the pool's last window (only the data differs from engine)
    worst_pool: float  # the worst replica's ratio pool / engine (over the whole run)
    worst_instance: float


def run_cluster(
    replicas: Sequence[FloatArray],
    window: int,
    setup: Setup,
    *,
    regime: str,
    seed: int,
    dispatch: str = "dynamic",
    inputs: str = "steps",
) -> ClusterRow:
    """Engine EPLB per replica vs one pool plan vs per-instance plans, on every replica's next window."""
    shape = setup.shape()
    points = rebalance_points(replicas[0].shape[0], window)
    names = [f"r{i}" for i in range(len(replicas))]
    excess: dict[str, list[list[float]]] = {k: [] for k in ("engine", "pool", "instance", "pool_deepseek")}
    for t in points:
        own = {n: window_sums(c, t, window) for n, c in zip(names, replicas, strict=True)}
        samples = {
            n: step_samples(c, t - window, window) if inputs == "steps" else None
            for n, c in zip(names, replicas, strict=True)
        }
        pool = np.sum(list(own.values()), axis=0)
        pool_steps = None
        if inputs == "steps":
            # in time order, oldest first (the forecast reads the newest samples as where the mix is now)
            stacked = np.stack([s for s in samples.values() if s is not None])  # [R, K, L, E]
            pool_steps = stacked.transpose(1, 0, 2, 3).reshape(-1, *stacked.shape[2:])
        pool_map = plan(pool, steps=pool_steps, horizon=1, dispatch=dispatch, **shape).physical_to_logical_map
        pool_ds = baseline_plan(pool[-1], **shape)
        for v in excess.values():
            v.append([])
        mine = plan_instances(own, pool=pool, steps=samples, horizon=1, dispatch=dispatch, **shape)
        for n, c in zip(names, replicas, strict=True):
            nxt = c[t : t + window]

            def ex(phy2log: IntArray, nxt: FloatArray = nxt) -> float:
                load = gpu_loads(phy2log, nxt, setup.num_gpus, dispatch, setup.num_nodes)
                return float(imbalance(load).mean() - 1.0)

            excess["engine"][-1].append(ex(baseline_plan(own[n][-1], **shape)))
            excess["pool"][-1].append(ex(pool_map))
            excess["instance"][-1].append(ex(mine[n].physical_to_logical_map))
            excess["pool_deepseek"][-1].append(ex(pool_ds))
    per_replica = {k: np.asarray(v).mean(axis=0) for k, v in excess.items()}  # [replicas]
    return ClusterRow(
        setup.name,
        regime,
        seed,
        len(replicas),
        float(per_replica["engine"].mean()),
        float(per_replica["pool"].mean()),
        float(per_replica["instance"].mean()),
        float(per_replica["pool_deepseek"].mean()),
        float((per_replica["pool"] / per_replica["engine"]).max()),
        float((per_replica["instance"] / per_replica["engine"]).max()),
    )


# --- planning time at DeepSeek-V3 scale ------------------------------------------------------------


def time_planning(
    num_gpus: int, num_nodes: int, *, layers: int = 58, repeats: int = 3, seed: int = 0
) -> dict[str, float]:
    """Median wall time (ms): 58 layers, 256 experts + 32 redundant, 8 groups, 8 windows + 32 steps held."""
    from .regimes import synthetic_counts

    setup = Setup("V3", 256, 32, num_gpus, num_nodes, 8, num_gpus * 128, num_gpus * 128, 48.0)
    window = 16
    counts = synthetic_counts(setup, "slow", window=window, steps=10 * window, layers=layers, seed=seed)
    first = window_sums(counts, 9 * window, window)
    later = window_sums(counts, 10 * window, window)
    steps = step_samples(counts, 9 * window, window)
    shape = setup.shape()
    current = plan(first, horizon=1, dispatch="dynamic", **shape).physical_to_logical_map
    cap = int(MOVE_SHARE * current.size)
    runs: dict[str, Callable[[], object]] = {
        "baseline": lambda: baseline_plan(later[-1], **shape),
        "ours": lambda: plan(later, steps=steps, horizon=1, dispatch="dynamic", **shape),
        "ours windows-only": lambda: plan(later, horizon=1, dispatch="dynamic", **shape),
        "ours from current": lambda: plan(
            later, steps=steps, horizon=1, dispatch="dynamic", current=current, max_moves=cap, **shape
        ),
        "in-engine fallback": lambda: plan(later[-1], dispatch="static", current=current, **shape),
    }
    out = {}
    for name, run in runs.items():
        wall = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            wall.append(1000 * (time.perf_counter() - started))
        out[name] = float(np.median(wall))
    return out


__all__ = ["SETUPS", "ClusterRow", "Row", "Score", "run_case", "run_cluster", "time_planning"]
