"""Predict the next window's routing from a history of steps, with the errors to hedge.

Why not the last window's average (what engines do): traffic drifts, so recent steps say
more about the next window than old ones, but single steps are noisy. The forecast is the
lookback mean plus a shrunk recent deviation, ``m + a * (ewma_h - m)``; the half-life h and
the shrink a are fitted by backtesting on the history itself (predict each past block of
``horizon`` steps from the steps before it). Features use the same lookback length at every
backtest point, so they mean the same thing there as at the final forecast. (A free
least-squares blend of several half-lives was tried and overfits.)

The backtest also yields real forecast errors, one [L, E] vector per backtest point. They
are kept raw, not summarised as a per-expert variance, because their structure is the
point: when traffic shifts toward one domain, all of that domain's hot experts rise
together. The planner hedges against ``mean + error_j`` scenarios. (Independent Gaussian
errors and recent per-step deviations were tried as scenarios and did not help.)

Everything is in shares: each step's counts divided by that step's total per layer, so a
busy step does not outweigh a quiet one, and balance (max/mean) is scale-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import FloatArray

HALF_LIVES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # steps, for the recent level
MAX_SPLITS = 8  # backtest points for fitting h and a
FIT_LAYERS = 16  # layers used to fit h and a (shared by all layers)
MAX_SCENARIOS = 10  # the forecast itself plus up to 9 backtest errors


@dataclass(frozen=True)
class Forecast:
    """mean [L, E] predicted share per step; scenarios [K, L, E] plausible steps around it."""

    mean: FloatArray
    scenarios: FloatArray
    half_life: float
    shrink: float
    horizon: int


def shares(history: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per-step shares [T, L, E] and a [T, L] 0/1 mask of steps that saw tokens."""
    total = history.sum(axis=-1, keepdims=True)
    seen = total[..., 0] > 0
    out = np.where(total > 0, history / np.where(total > 0, total, 1.0), 1.0 / history.shape[-1])
    return out, seen.astype(np.float64)


def ewma_weights(ends: list[int], steps: int, half_lives: tuple[float, ...]) -> FloatArray:
    """[len(ends), H, T] exponential weights over the steps before each end (newest heaviest)."""
    t = np.arange(steps, dtype=np.float64)
    out = np.zeros((len(ends), len(half_lives), steps))
    for i, end in enumerate(ends):
        ages = end - 1 - t[:end]
        out[i, :, :end] = 0.5 ** (ages[None, :] / np.array(half_lives)[:, None])
    return out


def weighted_mean(weights: FloatArray, values: FloatArray, mask: FloatArray) -> FloatArray:
    """Weighted means over steps: weights [..., T], values [T, L, E] -> [..., L, E]."""
    lead = weights.shape[:-1]
    w = weights.reshape(-1, weights.shape[-1])
    num = (w @ (values * mask[..., None]).reshape(values.shape[0], -1)).reshape(w.shape[0], *values.shape[1:])
    den = w @ mask
    out = np.where(den[..., None] > 0, num / np.where(den > 0, den, 1.0)[..., None], 1.0 / values.shape[-1])
    result: FloatArray = out.reshape(*lead, *values.shape[1:])
    return result


def _block_mean(values: FloatArray, mask: FloatArray, start: int, length: int) -> FloatArray:
    block = slice(start, start + length)
    out: FloatArray = weighted_mean(np.ones((1, length)), values[block], mask[block])[0]
    return out


def forecast(
    history: FloatArray, *, horizon: int | None = None, num_scenarios: int = MAX_SCENARIOS
) -> Forecast:
    """Forecast the mean share per step over the next ``horizon`` steps (default: an eighth of the history).

    Works best with a history of about eight horizons: enough backtest points to fit the
    shrink and to sample the forecast errors the plan is hedged against.
    """
    values, mask = shares(history)
    steps = values.shape[0]
    horizon = max(1, min(horizon or steps // 8, steps))
    stride = max(1, horizon // 2)
    lookback = max(1, min(2 * horizon, steps - horizon - stride))
    splits = list(range(steps - horizon, lookback - 1, -stride))[:MAX_SPLITS]
    if steps <= horizon or not splits:
        mean = weighted_mean(np.ones((1, steps)), values, mask)[0]
        return Forecast(mean=mean, scenarios=mean[None], half_life=float("inf"), shrink=0.0, horizon=horizon)
    layers = np.unique(np.linspace(0, values.shape[1] - 1, min(FIT_LAYERS, values.shape[1])).astype(int))
    half_life, shrink = _fit(values[:, layers], mask[:, layers], splits, lookback, horizon)
    mean = _predict(values, mask, [steps], lookback, half_life, shrink)[0]
    # hedge against errors from backtest points spread over the whole history
    spread = max(1, (steps - horizon - lookback) // max(1, num_scenarios - 2))
    hedge_splits = list(range(steps - horizon, lookback - 1, -spread))[: max(0, num_scenarios - 1)]
    scen = [mean[None]]
    if hedge_splits:
        target = np.stack([_block_mean(values, mask, s, horizon) for s in hedge_splits])
        scen.append(mean[None] + target - _predict(values, mask, hedge_splits, lookback, half_life, shrink))
    scenarios = np.clip(np.concatenate(scen), 0.0, None)
    return Forecast(mean=mean, scenarios=scenarios, half_life=half_life, shrink=shrink, horizon=horizon)


def _features(
    values: FloatArray, mask: FloatArray, ends: list[int], lookback: int, half_lives: tuple[float, ...]
) -> tuple[FloatArray, FloatArray]:
    """Lookback means [J, L, E] and EWMA deviations from them [J, H, L, E] at each end."""
    steps = values.shape[0]
    flat = np.zeros((len(ends), steps))
    for i, end in enumerate(ends):
        flat[i, end - lookback : end] = 1.0
    ewma = ewma_weights(ends, steps, half_lives) * flat[:, None, :]
    base = weighted_mean(flat, values, mask)
    return base, weighted_mean(ewma, values, mask) - base[:, None]


def _fit(
    values: FloatArray, mask: FloatArray, splits: list[int], lookback: int, horizon: int
) -> tuple[float, float]:
    """Half-life and shrink factor with the smallest backtest error (shrink in closed form, clipped to [0, 1])."""
    base, dev = _features(values, mask, splits, lookback, HALF_LIVES)
    target = np.stack([_block_mean(values, mask, s, horizon) for s in splits]) - base  # [J, L, E]
    cross = np.einsum("jhle,jle->h", dev, target)
    power = np.einsum("jhle,jhle->h", dev, dev)
    shrink = np.clip(cross / np.where(power > 0, power, 1.0), 0.0, 1.0)
    error = ((target[:, None] - shrink[None, :, None, None] * dev) ** 2).sum(axis=(0, 2, 3))
    best = int(np.argmin(error))
    return HALF_LIVES[best], float(shrink[best])


def _predict(
    values: FloatArray, mask: FloatArray, ends: list[int], lookback: int, half_life: float, shrink: float
) -> FloatArray:
    base, dev = _features(values, mask, ends, lookback, (half_life,))
    out: FloatArray = np.clip(base + shrink * dev[:, 0], 0.0, None)
    return out
