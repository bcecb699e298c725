"""Side-by-side benchmark: our planner against DeepSeek's EPLB on the same synthetic traces.

Every number is measured on future traffic (see scoring.py). Setups follow the facts file:
EP8 is an OLMoE-like model (64 experts, top-8) in decode; EP32 is DeepSeek-V3-like prefill
(256 experts + 32 redundant, 8 expert groups, 4 nodes of 8 GPUs, a few dozen prompts per
step); EP72 and EP144 are DeepSeek-V3-like decode (128 sequences per GPU) on 9 and 18 nodes.
Two traffic regimes: ``steady`` (the domain mix wanders slowly, over ~8 windows) and
``shifting`` (it moves within ~2 windows, e.g. tenants switching between chat and code).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from .baseline import baseline_plan
from .forecast import Forecast, shares
from .fresh import fresh_placement
from .layout import FloatArray, IntArray, make_layout
from .metrics import gpu_loads, imbalance
from .planner import plan
from .scoring import Score, rebalance_points, rolling_plans, score_plans
from .trace import TraceConfig, generate_trace

MOVE_SHARE = 0.25  # our move budget per rebalance: this share of what the baseline moved
HISTORY_WINDOWS = 8  # history our planner gets, in windows (the baseline sees only the last one)


@dataclass(frozen=True)
class Setup:
    """A deployment and the shape of its batches."""

    name: str
    num_experts: int
    num_redundant: int
    num_gpus: int
    num_nodes: int
    num_groups: int
    tokens_per_step: int
    batch_sequences: int
    sequence_steps: float

    def baseline(self, window_loads: FloatArray) -> IntArray:
        return baseline_plan(
            window_loads,
            num_gpus=self.num_gpus,
            num_nodes=self.num_nodes,
            num_redundant=self.num_redundant,
            num_groups=self.num_groups,
        )

    def ours(
        self,
        history: FloatArray,
        *,
        dispatch: str,
        horizon: int | None = None,
        current: IntArray | None = None,
        max_moves: int | None = None,
    ) -> IntArray:
        return plan(
            history,
            num_gpus=self.num_gpus,
            num_nodes=self.num_nodes,
            num_redundant=self.num_redundant,
            num_groups=self.num_groups,
            dispatch=dispatch,
            horizon=horizon,
            current=current,
            max_moves=max_moves,
        ).physical_to_logical_map


SETUPS: dict[str, Setup] = {
    "EP8": Setup("EP8", 64, 8, 8, 1, 1, 4096, 4096, 48.0),
    "EP32": Setup("EP32", 256, 32, 32, 4, 8, 32 * 4096, 64, 1.0),
    "EP72": Setup("EP72", 256, 32, 72, 9, 8, 72 * 128, 72 * 128, 48.0),
    "EP144": Setup("EP144", 256, 32, 144, 18, 8, 144 * 128, 144 * 128, 48.0),
}
REGIMES: dict[str, tuple[float, float]] = {"steady": (0.6, 8.0), "shifting": (1.5, 2.0)}  # walk sd, windows


def trace_config(
    setup: Setup, regime: str, *, window: int, steps: int, layers: int, seed: int
) -> TraceConfig:
    sigma, windows = REGIMES[regime]
    return TraceConfig(
        num_layers=layers,
        num_experts=setup.num_experts,
        tokens_per_step=setup.tokens_per_step,
        batch_sequences=setup.batch_sequences,
        sequence_steps=setup.sequence_steps,
        num_steps=steps,
        seed=seed,
        walk_sigma=sigma,
        walk_steps=windows * window,
        drift_period=64.0 * window,
    )


@dataclass(frozen=True)
class Row:
    setup: str
    regime: str
    dispatch: str
    baseline: Score
    ours: Score
    budgeted: Score  # ours with the current placement and 25% of the baseline's moves
    bound: float | None  # our packer given the true mean of the next window (no forecast, no hedging)
    plan_ms: float


def compare(
    setup: Setup,
    regime: str,
    *,
    window: int = 64,
    windows: int = 8,
    layers: int = 8,
    seed: int = 1,
    dispatch: str = "dynamic",
    with_bound: bool = False,
) -> Row:
    """Baseline, ours fresh and ours movement-limited, scored on the same future steps."""
    warmup = HISTORY_WINDOWS * window
    steps = warmup + windows * window
    counts = generate_trace(
        trace_config(setup, regime, window=window, steps=steps, layers=layers, seed=seed)
    ).counts
    score_kw = {"window": window, "warmup": warmup, "num_gpus": setup.num_gpus, "num_nodes": setup.num_nodes}

    def base(history: FloatArray, previous: IntArray | None, k: int) -> IntArray:
        return setup.baseline(history[-window:].sum(axis=0))

    def fresh(history: FloatArray, previous: IntArray | None, k: int) -> IntArray:
        return setup.ours(history[-warmup:], horizon=window, dispatch=dispatch)

    base_maps = rolling_plans(counts, base, window=window, warmup=warmup)
    base_score = score_plans(counts, base_maps, dispatch=dispatch, **score_kw)
    budgets = base_score.moves

    def budgeted(history: FloatArray, previous: IntArray | None, k: int) -> IntArray:
        cap = None if previous is None else int(MOVE_SHARE * budgets[k])
        return setup.ours(
            history[-warmup:], horizon=window, dispatch=dispatch, current=previous, max_moves=cap
        )

    started = time.perf_counter()
    ours_maps = rolling_plans(counts, fresh, window=window, warmup=warmup)
    plan_ms = 1000 * (time.perf_counter() - started) / max(1, len(ours_maps))
    ours = score_plans(counts, ours_maps, dispatch=dispatch, **score_kw)
    moved = score_plans(
        counts, rolling_plans(counts, budgeted, window=window, warmup=warmup), dispatch=dispatch, **score_kw
    )
    bound = _oracle_bound(counts, setup, window, warmup, dispatch) if with_bound else None
    return Row(setup.name, regime, dispatch, base_score, ours, moved, bound, plan_ms)


def _oracle_bound(counts: FloatArray, setup: Setup, window: int, warmup: int, dispatch: str) -> float:
    """Excess of our placement when it knows the next window's mean (what forecasting could reach)."""
    values, _ = shares(counts)
    layout = make_layout(
        counts.shape[1],
        counts.shape[2],
        num_gpus=setup.num_gpus,
        num_nodes=setup.num_nodes,
        num_redundant=setup.num_redundant,
        num_groups=setup.num_groups,
    )
    ratios = []
    for t in rebalance_points(counts.shape[0], window, warmup):
        mean = values[t : t + window].mean(axis=0)
        phy2log = fresh_placement(Forecast(mean, mean[None], 0.0, 0.0, window), layout, dispatch)
        load = gpu_loads(phy2log, counts[t : t + window], setup.num_gpus, dispatch, setup.num_nodes)
        ratios.append(imbalance(load).ravel())
    return float(np.concatenate(ratios).mean() - 1.0)


def time_planning(
    num_gpus: int, num_nodes: int, *, layers: int = 58, history: int = 64, repeats: int = 3, seed: int = 0
) -> dict[str, float]:
    """Median wall time (ms) at DeepSeek-V3 scale: 256 experts + 32 redundant, 8 groups."""
    setup = Setup("V3", 256, 32, num_gpus, num_nodes, 8, num_gpus * 128, num_gpus * 128, 48.0)
    cfg = trace_config(setup, "steady", window=history // 4, steps=2 * history, layers=layers, seed=seed)
    counts = generate_trace(cfg).counts
    first = setup.ours(counts[:history], dispatch="dynamic")
    later = counts[history:]
    cap = int(MOVE_SHARE * first.size)
    runs: dict[str, Callable[[], IntArray]] = {
        "baseline": partial(setup.baseline, later.sum(axis=0)),
        "ours dynamic": partial(setup.ours, later, dispatch="dynamic"),
        "ours static": partial(setup.ours, later, dispatch="static"),
        "ours +current": partial(setup.ours, later, dispatch="dynamic", current=first, max_moves=cap),
    }
    out = {}
    for name, run in runs.items():
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(1000 * (time.perf_counter() - started))
        out[name] = float(np.median(times))
    return out


def calibration(seed: int = 1) -> str:
    """How the trace compares with the measured OLMoE numbers it is calibrated to."""
    cfg = TraceConfig(num_layers=16, num_experts=64, num_steps=256, seed=seed)
    trace = generate_trace(cfg)
    peak = trace.popularity.max(axis=-1) * cfg.num_experts  # [D, L]
    parts = [
        f"{name} peak/fair {np.median(peak[d]):.1f}x ({peak[d].min():.1f}-{peak[d].max():.1f})"
        for d, (name, _) in enumerate(cfg.domains)
    ]
    pure = replace(cfg, domains=cfg.domains[:1])
    prose = generate_trace(pure).counts
    seq = prose.reshape(prose.shape[0], prose.shape[1], 8, -1).sum(axis=-1)
    parts.append(f"prose EP8 sequential max/mean {imbalance(seq).mean():.2f} (measured 1.32)")
    return "; ".join(parts)


def format_rows(rows: list[Row]) -> str:
    """A plain-text table; ratios are ours / baseline (lower is better)."""
    head = (
        f"{'setup':<6} {'traffic':<9} {'disp':<7} | {'base excess':>11} {'ours':>7} {'ratio':>6} | "
        f"{'p95 base':>8} {'ours':>6} | {'oracle':>6} | {'moves/plan base':>15} {'ours@25%: excess':>17} "
        f"{'ratio':>6} {'moves':>6} | {'ms/plan':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        plans = max(1, len(r.baseline.moves) - 1)
        bound = "   -  " if r.bound is None else f"{r.bound / r.baseline.excess:6.2f}"
        lines.append(
            f"{r.setup:<6} {r.regime:<9} {r.dispatch:<7} | {r.baseline.excess:11.4f} {r.ours.excess:7.4f} "
            f"{r.ours.excess / r.baseline.excess:6.2f} | {r.baseline.p95:8.3f} {r.ours.p95:6.3f} | {bound} | "
            f"{r.baseline.moved / plans:15.0f} {r.budgeted.excess:17.4f} {r.budgeted.excess / r.baseline.excess:6.2f} "
            f"{r.budgeted.moved / max(1, r.baseline.moved):6.2f} | {r.plan_ms:7.0f}"
        )
    return "\n".join(lines)
