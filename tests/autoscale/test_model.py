"""The performance model: latency against load per instance, fitted online from a wrong prior."""

from __future__ import annotations

import numpy as np
import pytest

from moe_operator.autoscale.model import Fit, prior_decode, update

TRUE = Fit(base_s=0.03, mu=4.0)


def _observe(fit: Fit, rates: list[float], seed: int = 0) -> Fit:
    rng = np.random.default_rng(seed)
    for r in rates:
        fit = update(fit, r, TRUE.latency(r) * float(np.exp(rng.normal(0, 0.05))))
    return fit


def test_the_curve_is_base_over_one_minus_rho() -> None:
    assert TRUE.latency(0.0) == pytest.approx(0.03)
    assert TRUE.latency(2.0) == pytest.approx(0.06)
    assert TRUE.latency(4.0) == float("inf")
    assert TRUE.rate_at(0.06) == pytest.approx(2.0)
    assert TRUE.rate_at(0.02) == 0.0  # an SLO below the no-load latency is unreachable


@pytest.mark.parametrize("error", [0.5, 0.7, 1.5])
def test_a_wrong_prior_converges_when_load_moves(error: float) -> None:
    prior = Fit(base_s=0.03, mu=4.0 * error)
    rates = list(np.linspace(0.3, 3.0, 200))
    fit = _observe(prior, rates)
    assert fit.rate_at(0.06) == pytest.approx(2.0, rel=0.1)
    assert abs(fit.rate_at(0.06) - 2.0) < abs(prior.rate_at(0.06) - 2.0)


def test_without_data_or_with_garbage_the_prior_stands() -> None:
    prior = Fit(base_s=0.03, mu=3.0)
    assert prior.curve() == (0.03, 3.0)
    fit = update(prior, 0.0, 0.05)
    fit = update(fit, 1.0, None)
    fit = update(fit, 1.0, float("nan"))
    fit = update(fit, float("inf"), 0.05)
    assert fit == prior


def test_decode_prior_comes_from_the_step_cost() -> None:
    # the replay engine's defaults: 20 ms + 0.8 ms per running request, 128 output tokens
    p = prior_decode(0.02, 0.0008, 128)
    assert p.base_s == 0.02 and p.mu == pytest.approx(1 / (0.0008 * 128))
