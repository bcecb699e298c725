"""Predict the next window's routing, choosing how far back to look from the history itself.

Engines fit the last window (DeepSeek EPLB as SGLang runs it). That is the best forecast
when traffic moves fast, and a noisy one when it does not. Instead of fixing a rule, every
plan runs a rolling-origin backtest over the rows it holds: at each of the last few origins
(one horizon apart) every candidate forecasts the next ``horizon`` rows from the rows
before the origin, and the candidate with the smallest error wins. Candidates: the last
``horizon`` rows ("last window only", what engines do), exponentially weighted means with
half-lives of 1/2, 1, 2 and 4 horizons, and the mean of everything. The error is the
squared share error per expert divided by its copy count (the error a GPU sees is its
copies' errors, each split over the expert's copies). Ties and near-ties (within
``MARGIN``) go to "last window only", so with no signal in the history the planner sees
what the baseline sees.

The backtest also yields the chosen rule's real errors, one [L, E] vector per origin. They
are kept raw, not summarised as a variance, because their structure is the point: when
traffic shifts toward one domain, all of that domain's hot experts rise together. Each
error is used with both signs: a past error says which experts move together and by how
much, not which way the next move goes (after a switch to a new mix, the same error again
would overshoot further into it; the mirrored one is the mix coming back). With
per-step samples (``steps``), each scenario adds one step's deviation from the samples'
mean, so the plan also hedges the spread within a window (one domain's prompts filling a
prefill step, experts that fire together).

Rows are sums, so every candidate sees where the mix was on average over a row, half a row
behind where it is at the row's end. With per-step samples (oldest first), the newest
quarter of them says where it is now: the forecast moves by the newest quarter's mean minus
all samples' mean, shrunk per layer by that difference's own sampling noise (positive-part
James-Stein: weight 1 - noise / squared size, the noise taken from the samples' spread, which
the drift itself inflates, so the weight errs low). A mix that does not move within the row
gives a difference of the size of its noise and a weight near zero. A single row (no
backtest, e.g. a plan fitted on the window it is scored on) is taken as it is.

Everything is in shares: each row's counts divided by that row's total per layer, so a
busy row does not outweigh a quiet one, and balance (max/mean) is scale-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import FloatArray

MAX_ORIGINS = 6  # backtest origins (the last ones, one horizon apart)
MAX_BLOCKS = 64  # longer histories are averaged into this many blocks first (cost)
MARGIN = 0.02  # relative backtest advantage a rule needs over "last window only"
MAX_STEP_SCENARIOS = 32  # per-step samples used as scenarios
RECENT_SHARE = 0.25  # newest share of the step samples that says where the mix is now
HALF_LIVES = (0.5, 1.0, 2.0, 4.0)  # in horizons


@dataclass(frozen=True)
class Forecast:
    """mean [L, E] predicted share per step; scenarios [K, L, E] plausible steps around it."""

    mean: FloatArray
    scenarios: FloatArray
    rule: str  # the candidate the backtest chose
    horizon: int  # rows of history the forecast is for
    errors: FloatArray | None = None  # [C] backtest error of each candidate (None without a backtest)
    recent: np.ndarray | None = None  # [K] scenarios from the newer half of their kind (held out)
    level_weight: FloatArray | None = None  # [L] weight of the newest steps' shift (None: not tried)


def shares(history: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per-row shares [T, L, E] and a [T, L] 0/1 mask of rows that saw tokens."""
    total = history.sum(axis=-1, keepdims=True)
    seen = total[..., 0] > 0
    out = np.where(total > 0, history / np.where(total > 0, total, 1.0), 1.0 / history.shape[-1])
    return out, seen.astype(np.float64)


def candidate_names(horizon: int) -> list[str]:
    return ["last", *(f"ewma{h:g}" for h in HALF_LIVES), "mean"]


def rule_weights(ends: list[int], steps: int, horizon: int) -> FloatArray:
    """[J, C, T] weights over the rows before each end, one row of weights per candidate."""
    names = candidate_names(horizon)
    out = np.zeros((len(ends), len(names), steps))
    rows = np.arange(steps, dtype=np.float64)
    for j, end in enumerate(ends):
        ages = end - 1 - rows[:end]
        out[j, 0, max(0, end - horizon) : end] = 1.0
        for c, half in enumerate(HALF_LIVES, start=1):
            out[j, c, :end] = 0.5 ** (ages / (half * horizon))
        out[j, -1, :end] = 1.0
    return out


def weighted_mean(weights: FloatArray, values: FloatArray, mask: FloatArray) -> FloatArray:
    """Weighted means over rows: weights [..., T], values [T, L, E] -> [..., L, E] (rows without tokens skipped)."""
    lead = weights.shape[:-1]
    w = weights.reshape(-1, weights.shape[-1])
    num = (w @ (values * mask[..., None]).reshape(values.shape[0], -1)).reshape(w.shape[0], *values.shape[1:])
    den = w @ mask
    out = np.where(den[..., None] > 0, num / np.where(den > 0, den, 1.0)[..., None], 1.0 / values.shape[-1])
    result: FloatArray = out.reshape(*lead, *values.shape[1:])
    return result


def blocks(values: FloatArray, mask: FloatArray, horizon: int) -> tuple[FloatArray, FloatArray, int]:
    """Average a long history into at most MAX_BLOCKS blocks (newest rows kept whole); horizon in blocks."""
    steps = values.shape[0]
    size = -(-steps // MAX_BLOCKS)
    if size <= 1:
        return values, mask, horizon
    count = steps // size
    keep = values[steps - count * size :].reshape(count, size, *values.shape[1:])
    kmask = mask[steps - count * size :].reshape(count, size, -1)
    den = kmask.sum(axis=1)
    num = (keep * kmask[..., None]).sum(axis=1)
    out = np.where(den[..., None] > 0, num / np.where(den > 0, den, 1.0)[..., None], 1.0 / values.shape[-1])
    return out, (den > 0).astype(np.float64), max(1, round(horizon / size))


def forecast(
    history: FloatArray,
    *,
    horizon: int | None = None,
    steps: FloatArray | None = None,
    weight: FloatArray | None = None,
    prior: FloatArray | None = None,
) -> Forecast:
    """Forecast the mean share per step over the next ``horizon`` rows (default: an eighth of the history).

    ``steps`` [K, L, E]: single engine steps from the newest row, oldest first (optional). ``weight``
    [L, E]: relative cost of an error per expert (default: equal).
    """
    values, mask = shares(history)
    per_step = None if steps is None else shares(steps)  # ([K, L, E], [K, L]), oldest first
    raw_horizon = max(1, min(horizon or values.shape[0] // 8, values.shape[0]))
    values, mask, horizon = blocks(values, mask, raw_horizon)
    num_rows = values.shape[0]
    names = candidate_names(horizon)
    sources = [(values, mask)]
    if prior is not None:  # the same rules on another history (the pool's), judged on this one's future
        pv, pm = shares(prior)
        sources.append(blocks(pv, pm, raw_horizon)[:2])
        names += [f"prior-{n}" for n in names]
    ends = [num_rows - j * horizon for j in range(1, MAX_ORIGINS + 1) if num_rows - j * horizon >= 1]
    final = np.concatenate(
        [weighted_mean(rule_weights([num_rows], num_rows, horizon)[0], v, m) for v, m in sources]
    )  # [C, L, E]
    if not ends:
        scen, recent = _scenarios(final[0], None, per_step)
        return Forecast(final[0], scen, "last", horizon, recent=recent)
    predicted = np.concatenate(
        [weighted_mean(rule_weights(ends, num_rows, horizon), v, m) for v, m in sources], axis=1
    )  # [J, C, L, E]
    target = np.stack(
        [
            weighted_mean(np.ones((1, horizon)), values[e : e + horizon], mask[e : e + horizon])[0]
            for e in ends
        ]
    )
    w = np.ones(values.shape[1:]) if weight is None else weight
    err = (((predicted - target[:, None]) ** 2) * w).sum(axis=(2, 3)).mean(axis=0)  # [C]
    best = int(np.argmin(err))
    if err[0] <= err[best] * (1 + MARGIN):
        best = 0
    residual = target - predicted[:, best]  # [J, L, E] the chosen rule's own past errors
    mean = np.clip(final[best], 0.0, None)
    level = None
    if per_step is not None:
        shift, level = newest_shift(*per_step)
        mean = shares(np.clip(mean + shift, 0.0, None))[0]
    scen, recent = _scenarios(mean, residual, per_step)
    return Forecast(mean, scen, names[best], horizon, err, recent, level)


def newest_shift(per_step: FloatArray, seen: FloatArray) -> tuple[FloatArray, FloatArray]:
    """How far the newest quarter of step shares [K, L, E] (oldest first) sits from all of them,
    shrunk per layer by its sampling noise. -> (shift [L, E], weight [L] in [0, 1]).

    Steps without tokens in a layer (``seen`` [K, L] is 0) are left out of it (an idle tail is
    not a new mix)."""
    newest = max(2, round(RECENT_SHARE * per_step.shape[0]))
    n_all, n_new = seen.sum(axis=0), seen[-newest:].sum(axis=0)  # [L]
    usable = (n_new >= 2) & (n_all - n_new >= 2)
    w = seen[..., None]
    mean_all = (per_step * w).sum(axis=0) / np.maximum(n_all, 1)[:, None]
    mean_new = (per_step[-newest:] * w[-newest:]).sum(axis=0) / np.maximum(n_new, 1)[:, None]
    diff = mean_new - mean_all  # [L, E]
    var = (((per_step - mean_all) ** 2) * w).sum(axis=0) / np.maximum(n_all - 1, 1)[:, None]
    noise = var.sum(axis=1) * (1.0 / np.maximum(n_new, 1) - 1.0 / np.maximum(n_all, 1))  # E|diff|^2, no drift
    size = (diff**2).sum(axis=1)
    weight: FloatArray = np.where(
        usable, np.clip(1.0 - noise / np.where(size > 0, size, np.inf), 0.0, 1.0), 0.0
    )
    out: FloatArray = weight[:, None] * diff
    return out, weight


def _scenarios(
    mean: FloatArray, residual: FloatArray | None, step_shares: tuple[FloatArray, FloatArray] | None
) -> tuple[FloatArray, np.ndarray]:
    """The forecast itself, the forecast plus and minus each past error, and (with steps) plus a step's spread each.

    Also returns which scenarios are the newer half of their kind (the later step samples,
    the more recent backtest errors): plans are tried on the older half and judged on these.
    """
    parts = [mean[None]]
    recent = [np.zeros(1, dtype=bool)]
    if residual is not None:
        newest = np.arange(residual.shape[0]) < residual.shape[0] // 2  # residual is newest first
        residual = np.concatenate([residual, -residual])
        parts.append(mean[None] + residual)
        recent.append(np.concatenate([newest, newest]))
    if step_shares is not None and step_shares[0].shape[0] > 1:
        per_step = step_shares[0]  # oldest first
        if per_step.shape[0] > MAX_STEP_SCENARIOS:
            per_step = per_step[np.linspace(0, per_step.shape[0] - 1, MAX_STEP_SCENARIOS).astype(int)]
        spread = per_step - per_step.mean(axis=0)
        level = (
            mean[None]
            if residual is None
            else mean[None] + residual[np.arange(spread.shape[0]) % residual.shape[0]]
        )
        parts.append(level + spread)
        recent.append(np.arange(spread.shape[0]) >= (spread.shape[0] + 1) // 2)
    out: FloatArray = np.clip(np.concatenate(parts), 0.0, None)
    return out, np.concatenate(recent)
