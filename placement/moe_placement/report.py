"""The bench's suites and tables (what `moe-operator eplb bench` prints).

Suites: ``synthetic`` (regimes x deployments), ``real`` (OLMoE routing, decode and prefill
under traffic-mix schedules), ``packing`` (fitted and scored on the same window: no
forecasting), ``cluster`` (replicas of a pool, each its own batch stream), ``timing``
(DeepSeek-V3 scale). Seeds and regimes default to the holdout set (regimes.py).
Ratios are ours / baseline excess; lower is better; a geometric mean summarises rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .baseline import baseline_plan
from .bench import ClusterRow, Row, packer_alone, run_case, run_cluster, step_samples, time_planning
from .layout import FloatArray
from .metrics import gpu_loads, imbalance
from .regimes import REAL, REAL_SETUPS, SETUPS, Setup, real_counts, synthetic_counts
from .replicate import greedy_counts

WINDOW = 64  # synthetic: steps per rebalance window


def geomean(values: Iterable[float]) -> float:
    arr = np.asarray(list(values), dtype=np.float64)
    return float(np.exp(np.log(np.maximum(arr, 1e-12)).mean())) if arr.size else float("nan")


@dataclass(frozen=True)
class Group:
    """Rows of one (deployment, traffic) over seeds, averaged: excess means, then ratios."""

    setup: str
    regime: str
    rows: tuple[Row, ...]

    def mean(self, pick: Callable[[Row], float]) -> float:
        return float(np.mean([pick(r) for r in self.rows]))

    @property
    def base(self) -> float:
        return self.mean(lambda r: r.base.excess)

    def ratio(self, pick: Callable[[Row], float]) -> float:
        return self.mean(pick) / self.base

    @property
    def ours(self) -> float:
        return self.ratio(lambda r: r.ours.excess)

    @property
    def oracle(self) -> float:
        return self.ratio(lambda r: r.oracle.excess)

    @property
    def captured(self) -> float:
        gain = self.base - self.mean(lambda r: r.oracle.excess)
        return (self.base - self.mean(lambda r: r.ours.excess)) / gain if gain > 0 else float("nan")

    @property
    def packing(self) -> float:
        return self.mean(lambda r: r.packed.excess) / self.mean(lambda r: r.base_fit.excess)

    @property
    def capped(self) -> float:
        return self.ratio(lambda r: r.capped.excess)

    @property
    def capped_moves(self) -> float:
        return sum(r.capped.moved for r in self.rows) / max(1, sum(r.base.moved for r in self.rows))


def group(rows: Sequence[Row]) -> list[Group]:
    keys: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        keys.setdefault((r.setup, r.regime), []).append(r)
    return [Group(s, g, tuple(v)) for (s, g), v in keys.items()]


HEAD = (
    f"{'setup':<8} {'traffic':<17} | {'base excess':>11} {'ours':>6} {'oracle':>6} {'captured':>8} | "
    f"{'packing':>7} | {'@25%':>6} {'moves':>6} | {'ms ours':>7} {'@25%':>6} {'base':>5}"
)


def format_group(g: Group) -> str:
    ms = g.mean(lambda r: r.plan_ms), g.mean(lambda r: r.capped_ms), g.mean(lambda r: r.base_ms)
    return (
        f"{g.setup:<8} {g.regime:<17} | {g.base:11.4f} {g.ours:6.2f} {g.oracle:6.2f} {g.captured:8.2f} | "
        f"{g.packing:7.2f} | {g.capped:6.2f} {g.capped_moves:6.2f} | {ms[0]:7.0f} {ms[1]:6.0f} {ms[2]:5.1f}"
    )


def summary(groups: Sequence[Group], label: str) -> str:
    if not groups:
        return ""
    return (
        f"{label}: geometric mean ours {geomean(g.ours for g in groups):.3f} (worst {max(g.ours for g in groups):.2f}), "
        f"oracle {geomean(g.oracle for g in groups):.3f}, packing {geomean(g.packing for g in groups):.3f} "
        f"(worst {max(g.packing for g in groups):.2f}), @25% {geomean(g.capped for g in groups):.3f} "
        f"(worst {max(g.capped for g in groups):.2f})"
    )


def synthetic_rows(
    setups: Sequence[str],
    regimes: Sequence[str],
    seeds: Sequence[int],
    *,
    layers: int,
    windows: int,
    dispatch: str,
    inputs: str,
    emit: Callable[[Row], None] = lambda r: None,
) -> list[Row]:
    from .bench import HISTORY

    out = []
    for name in setups:
        setup = SETUPS[name]
        for regime in regimes:
            for seed in seeds:
                steps = (HISTORY + windows) * WINDOW
                counts = synthetic_counts(setup, regime, window=WINDOW, steps=steps, layers=layers, seed=seed)
                row = run_case(
                    counts, WINDOW, setup, regime=regime, seed=seed, dispatch=dispatch, inputs=inputs
                )
                emit(row)
                out.append(row)
    return out


def real_rows(
    setups: Sequence[str],
    modes: Sequence[str],
    schedules: Sequence[str],
    seeds: Sequence[int],
    *,
    windows: int,
    dispatch: str,
    inputs: str,
    emit: Callable[[Row], None] = lambda r: None,
) -> list[Row]:
    from .bench import HISTORY

    out = []
    for mode in modes:
        for schedule in schedules:
            for seed in seeds:
                counts = real_counts(mode, schedule, windows=HISTORY + windows, seed=seed)
                for name in setups:
                    row = run_case(
                        counts,
                        REAL[mode].window,
                        REAL_SETUPS[name],
                        regime=f"{mode}-{schedule}",
                        seed=seed,
                        dispatch=dispatch,
                        inputs=inputs,
                    )
                    emit(row)
                    out.append(row)
    return out


# --- packing alone: the mean of the window a plan is fitted on ------------------------------------


@dataclass(frozen=True)
class PackingRow:
    setup: str
    slots: int
    lpt: float  # DeepSeek (greedy copies + LPT) max/mean on the fitted window's mean
    ours: float  # our packer (same greedy copies, LPT then exchanges) on the same mean
    ours_counts: float  # our plain plan (its own copies) on the same mean
    step_base: float  # per-step excess on that window, DeepSeek fitted on it
    step_ours: float  # the packer alone fitted on it (mean and step samples)


def packing_rows(
    setups: Sequence[str], seeds: Sequence[int], *, layers: int, windows: int
) -> list[PackingRow]:
    """Fitted and scored on the same window (no forecasting), per deployment, stationary traffic."""
    from .fresh import place_rows
    from .layout import make_layout
    from .packing import Bins, gpu_totals, lpt
    from .replicate import expand
    from .search import pair_refine

    out = []
    for name in setups:
        setup = SETUPS[name]
        lays = make_layout(layers, setup.num_experts, **setup.shape())
        vals: dict[str, list[float]] = {k: [] for k in ("lpt", "ours", "counts", "sb", "so")}
        for seed in seeds:
            steps = (windows + 1) * WINDOW
            counts = synthetic_counts(
                setup, "stationary", window=WINDOW, steps=steps, layers=layers, seed=seed
            )
            for t in range(WINDOW, steps, WINDOW):
                win = counts[t : t + WINDOW]
                mean: FloatArray = win.sum(axis=0) / win.sum(axis=(0, 2))[:, None]
                base = baseline_plan(win.sum(axis=0), **setup.shape())
                vals["lpt"].append(float(imbalance(gpu_loads(base, mean, setup.num_gpus)).mean()))
                copies = greedy_counts(mean, lays.num_slots, lays.num_gpus)
                expert = expand(copies)
                weight = np.take_along_axis(mean / copies, expert, axis=1)
                bins = Bins(setup.num_gpus, setup.slots_per_gpu, np.arange(setup.num_gpus))
                start = lpt(weight, expert, setup.num_experts, bins)
                better = pair_refine(weight[:, :, None], expert, setup.num_experts, bins, start)
                peak = gpu_totals(weight, better).max(axis=1) / (1.0 / setup.num_gpus)
                vals["ours"].append(float(peak.mean()))
                plain = place_rows(mean, mean[:, None, :], lays, "dynamic")
                vals["counts"].append(float(imbalance(gpu_loads(plain, mean, setup.num_gpus)).mean()))
                fitted = packer_alone(win, step_samples(counts, t, WINDOW), lays, "dynamic")
                for key, m in (("sb", base), ("so", fitted)):
                    vals[key].append(float(imbalance(gpu_loads(m, win, setup.num_gpus)).mean() - 1))
        out.append(
            PackingRow(
                name,
                setup.slots_per_gpu,
                float(np.mean(vals["lpt"])),
                float(np.mean(vals["ours"])),
                float(np.mean(vals["counts"])),
                float(np.mean(vals["sb"])),
                float(np.mean(vals["so"])),
            )
        )
    return out


def format_packing(rows: Sequence[PackingRow]) -> str:
    head = (
        f"{'setup':<8} {'slots/GPU':>9} | {'max/mean on the fitted mean: LPT':>33} {'ours (same copies)':>18} "
        f"{'ours (own copies)':>17} | {'per-step excess: base':>21} {'ours':>6} {'ratio':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.setup:<8} {r.slots:>9} | {r.lpt:33.4f} {r.ours:18.4f} {r.ours_counts:17.4f} | "
            f"{r.step_base:21.4f} {r.step_ours:6.4f} {r.step_ours / r.step_base:6.2f}"
        )
    return "\n".join(lines)


# --- cluster ------------------------------------------------------------------------------------------


def cluster_rows(
    cases: Sequence[tuple[str, str, str]],
    replicas: Sequence[int],
    affinities: Sequence[float],
    seeds: Sequence[int],
    *,
    layers: int,
    windows: int,
    dispatch: str,
    inputs: str,
    emit: Callable[[ClusterRow], None] = lambda r: None,
) -> list[ClusterRow]:
    """cases: (kind, setup, traffic) with kind 'real' (traffic 'mode-schedule') or 'synthetic'."""
    from .bench import HISTORY

    out = []
    for kind, name, traffic in cases:
        for count in replicas:
            for aff in affinities:
                for seed in seeds:
                    setup: Setup
                    if kind == "real":
                        mode, schedule = traffic.split("-", 1)
                        setup, window = REAL_SETUPS[name], REAL[mode].window
                        streams = [
                            real_counts(
                                mode, schedule, windows=HISTORY + windows, seed=seed, replica=r, affinity=aff
                            )
                            for r in range(count)
                        ]
                    else:
                        setup, window = SETUPS[name], WINDOW
                        steps = (HISTORY + windows) * WINDOW
                        streams = [
                            synthetic_counts(
                                setup,
                                traffic,
                                window=WINDOW,
                                steps=steps,
                                layers=layers,
                                seed=seed,
                                replica=r,
                                affinity=aff,
                            )
                            for r in range(count)
                        ]
                    row = run_cluster(
                        streams,
                        window,
                        setup,
                        regime=f"{traffic} aff={aff:g}",
                        seed=seed,
                        dispatch=dispatch,
                        inputs=inputs,
                    )
                    emit(row)
                    out.append(row)
    return out


def format_cluster(rows: Sequence[ClusterRow]) -> str:
    keys: dict[tuple[str, str, int], list[ClusterRow]] = {}
    for r in rows:
        keys.setdefault((r.setup, r.regime, r.replicas), []).append(r)
    head = (
        f"{'setup':<6} {'traffic':<24} {'replicas':>8} | {'engine EPLB excess':>18} {'per pool':>8} "
        f"{'per instance':>12} {'pool DeepSeek':>13} | {'worst replica: pool':>19} {'instance':>8}"
    )
    lines = [head, "-" * len(head)]
    for (setup, traffic, count), group_rows in keys.items():
        e = float(np.mean([r.engine for r in group_rows]))
        lines.append(
            f"{setup:<6} {traffic:<24} {count:>8} | {e:18.4f} {np.mean([r.pool for r in group_rows]) / e:8.2f} "
            f"{np.mean([r.instance for r in group_rows]) / e:12.2f} {np.mean([r.pool_deepseek for r in group_rows]) / e:13.2f} | "
            f"{max(r.worst_pool for r in group_rows):19.2f} {max(r.worst_instance for r in group_rows):8.2f}"
        )
    return "\n".join(lines)


def format_timing(sizes: Sequence[tuple[int, int]], repeats: int) -> Iterable[str]:
    for gpus, nodes in sizes:
        t = time_planning(gpus, nodes, repeats=repeats)
        yield (
            f"  {gpus:>3} GPUs / {nodes:>2} nodes ({(256 + 32) // gpus} slots/GPU): "
            + ", ".join(f"{k} {v:.0f}" for k, v in t.items())
        )
