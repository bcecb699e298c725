"""The forecast rule comes from a backtest on the history itself; scenarios carry its real errors."""

import numpy as np

from moe_placement.forecast import forecast


def _history(rng: np.random.Generator, levels: np.ndarray, noise: float) -> np.ndarray:
    """Window sums [T, 2, 16] around the given per-window share levels [T, 16]."""
    shares = np.clip(levels * rng.lognormal(0.0, noise, size=levels.shape), 1e-6, None)
    return np.repeat((1e5 * shares / shares.sum(axis=1, keepdims=True))[:, None, :], 2, axis=1)


def test_a_sudden_shift_is_followed_by_last_window_only() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.gamma(0.5, 1.0, 16), rng.gamma(0.5, 1.0, 16)
    levels = np.array([a if t < 4 else b for t in range(4)] + [b * (1 + 0.5 * t) for t in range(6)])
    fc = forecast(_history(rng, levels, 0.01), horizon=1)
    assert fc.rule == "last"


def test_a_noisy_stationary_history_is_averaged() -> None:
    rng = np.random.default_rng(1)
    levels = np.tile(rng.gamma(0.5, 1.0, 16), (16, 1))
    fc = forecast(_history(rng, levels, 0.3), horizon=1)
    assert fc.rule != "last"
    truth = levels[0] / levels[0].sum()
    last = _history(np.random.default_rng(1), levels, 0.3)[-1, 0]
    assert np.abs(fc.mean[0] - truth).sum() < np.abs(last / last.sum() - truth).sum()


def test_scenarios_are_the_forecast_plus_past_errors_and_step_spreads() -> None:
    rng = np.random.default_rng(2)
    hist = _history(rng, np.tile(rng.gamma(0.5, 1.0, 16), (8, 1)), 0.2)
    steps = hist[-1][None] * rng.lognormal(0.0, 0.3, size=(12, 2, 16))
    fc = forecast(hist, horizon=1, steps=steps)
    assert fc.scenarios.shape == (1 + 2 * 6 + 12, 2, 16)
    np.testing.assert_allclose(fc.scenarios[0], fc.mean)
    # each past error with both signs (where clipping at zero leaves both intact)
    up, down = fc.scenarios[1:7] - fc.mean, fc.scenarios[7:13] - fc.mean
    intact = (fc.scenarios[1:7] > 0) & (fc.scenarios[7:13] > 0)
    assert intact.mean() > 0.5
    np.testing.assert_allclose(up[intact], -down[intact], atol=1e-12)
    assert np.abs(up).max() > 0
    assert (fc.scenarios >= 0).all()
    np.testing.assert_allclose(fc.mean.sum(axis=-1), 1.0)


def test_a_prior_history_competes_in_the_same_backtest() -> None:
    """An instance's own windows are noisy; the pool's carry the same mix with less noise."""
    rng = np.random.default_rng(3)
    levels = np.tile(rng.gamma(0.5, 1.0, 16), (12, 1))
    own = _history(rng, levels, 0.4)
    pool = _history(rng, levels, 0.02)
    fc = forecast(own, horizon=1, prior=pool)
    assert fc.rule.startswith("prior-")
    assert fc.errors is not None and fc.errors.size == 12


def test_a_single_window_is_its_own_forecast() -> None:
    one = np.arange(1.0, 17.0)[None].repeat(2, axis=0)
    fc = forecast(one[None], horizon=1)
    np.testing.assert_allclose(fc.mean[0], one[0] / one[0].sum())
    assert fc.rule == "last" and fc.scenarios.shape[0] == 1


def _steps(
    rng: np.random.Generator, start: np.ndarray, end: np.ndarray, count: int, noise: float
) -> np.ndarray:
    """Step counts [count, 2, 16] whose shares move from ``start`` to ``end`` (oldest first)."""
    t = np.linspace(0.0, 1.0, count)[:, None]
    level = (1 - t) * start / start.sum() + t * end / end.sum()
    shares = np.clip(level * rng.lognormal(0.0, noise, size=level.shape), 1e-9, None)
    return np.repeat((4096 * shares / shares.sum(axis=1, keepdims=True))[:, None, :], 2, axis=1)


def test_steps_that_drift_within_the_window_move_the_forecast_toward_the_newest() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.gamma(0.5, 1.0, 16) + 0.05, rng.gamma(0.5, 1.0, 16) + 0.05
    hist = _history(rng, np.tile((a + b) / 2, (8, 1)), 0.01)
    steps = _steps(rng, a, b, 32, 0.05)
    fc = forecast(hist, horizon=1, steps=steps)
    assert fc.level_weight is not None and fc.level_weight.min() > 0.9
    truth = b / b.sum()
    unshifted = forecast(hist, horizon=1)
    assert np.abs(fc.mean[0] - truth).sum() < 0.6 * np.abs(unshifted.mean[0] - truth).sum()
    np.testing.assert_allclose(fc.mean.sum(axis=-1), 1.0)
    # the same samples in the other order: the shift points the other way
    backwards = forecast(hist, horizon=1, steps=steps[::-1])
    assert np.abs(backwards.mean[0] - a / a.sum()).sum() < np.abs(backwards.mean[0] - truth).sum()


def test_steps_that_only_scatter_barely_move_the_forecast() -> None:
    rng = np.random.default_rng(5)
    a = rng.gamma(0.5, 1.0, 16) + 0.05
    hist = _history(rng, np.tile(a, (8, 1)), 0.01)
    weights, moved, raw = [], 0.0, 0.0
    plain = forecast(hist, horizon=1).mean
    for _ in range(20):
        steps = _steps(rng, a, a, 32, 0.3)
        fc = forecast(hist, horizon=1, steps=steps)
        assert fc.level_weight is not None
        weights.append(fc.level_weight)
        per_step = steps / steps.sum(axis=-1, keepdims=True)
        raw += np.abs(per_step[-8:].mean(axis=0) - per_step.mean(axis=0)).sum()
        moved += np.abs(fc.mean - plain).sum()
    assert np.mean(weights) < 0.3
    assert moved < 0.3 * raw  # the forecast itself moves by the shrunk difference, not the raw one


def test_a_single_window_with_steps_is_not_shifted() -> None:
    rng = np.random.default_rng(6)
    a, b = rng.gamma(0.5, 1.0, 16) + 0.05, rng.gamma(0.5, 1.0, 16) + 0.05
    one = _history(rng, a[None], 0.0)
    fc = forecast(one, horizon=1, steps=_steps(rng, a, b, 32, 0.05))
    np.testing.assert_allclose(fc.mean[0], a / a.sum(), rtol=1e-9)
    assert fc.level_weight is None


def test_steps_without_tokens_are_not_a_new_mix() -> None:
    """An idle tail (passes that routed nothing) leaves the level where the routed steps put it."""
    rng = np.random.default_rng(7)
    a = rng.gamma(0.5, 1.0, 16) + 0.05
    hist = _history(rng, np.tile(a, (8, 1)), 0.01)
    steps = _steps(rng, a, a, 32, 0.05)
    steps[-8:] = 0.0
    fc = forecast(hist, horizon=1, steps=steps)
    assert fc.level_weight is not None and (fc.level_weight == 0).all()
    np.testing.assert_allclose(fc.mean, forecast(hist, horizon=1).mean)
