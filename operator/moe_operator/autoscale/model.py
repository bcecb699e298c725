"""A pool's performance model: latency against offered load, per instance, fitted online.

One curve serves both SLOs. A decode step costs ``a + b * running`` and, by Little's law,
``running = rate * output_tokens * ITL``, so ``ITL = a / (1 - rate / mu)`` with
``mu = 1 / (b * output_tokens)``; a prefill server is a queue whose sojourn time is
``TTFT = t0 / (1 - rate / mu)`` (M/M/1). Either way a quantile of the latency is
``base / (1 - rho)`` with ``rho = rate per instance / mu``, and the rate an instance can take
while meeting an SLO is ``mu * (1 - base / slo)``.

The curve is a line in ``(rate, 1 / latency)``: ``1/latency = 1/base - rate / (base * mu)``.
It is fitted by least squares over the pool's intervals with exponential forgetting (five
running sums, small enough for status), on top of the prior (the capacity model's numbers,
or the last fit) counted as ``PRIOR_WEIGHT`` intervals at no load and at half the prior's
capacity. So a pool that only ever ran at one load keeps the prior's slope, a pool that has
seen its load move gets its own curve, and under overload (the finished rate is what the
pool can serve, latency grows) the line bends toward the capacity it really has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

FORGET = 0.995  # weight of an interval after one more (half-life ~140 intervals)
PRIOR_WEIGHT = 20.0
MAX_RATE = 1e4  # requests/s per instance: beyond any engine, so a sample past it is a lie
LATENCY_RANGE = (1e-4, 1e4)  # seconds


@dataclass(frozen=True)
class Fit:
    """One objective's curve for one pool: latency quantile ``base / (1 - rate / mu)``."""

    base_s: float  # the quantile at no load, seconds (the prior's)
    mu: float  # requests/s per instance at which the latency diverges (the prior's)
    sums: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)  # w, x, y, xx, xy
    samples: int = 0  # intervals fitted

    def curve(self) -> tuple[float, float]:
        """(base, mu) of the fitted line: the prior where the data cannot tell."""
        if self.sums[0] <= 0:
            return self.base_s, self.mu
        w0, x1 = PRIOR_WEIGHT / 2, self.mu / 2
        y0, y1 = 1 / self.base_s, (1 - 0.5) / self.base_s
        w, sx, sy, sxx, sxy = self.sums
        w, sx, sy = w + 2 * w0, sx + w0 * x1, sy + w0 * (y0 + y1)
        sxx, sxy = sxx + w0 * x1 * x1, sxy + w0 * x1 * y1
        den = w * sxx - sx * sx
        if den <= 0:
            return self.base_s, self.mu
        slope = (w * sxy - sx * sy) / den
        icept = (sy - slope * sx) / w
        if not (math.isfinite(icept) and math.isfinite(slope)) or icept <= 0 or slope >= 0:
            return self.base_s, self.mu
        return 1 / icept, -icept / slope

    def latency(self, rate_per_instance: float) -> float:
        base, mu = self.curve()
        rho = rate_per_instance / mu
        return math.inf if rho >= 1 else base / (1 - rho)

    def rate_at(self, slo_s: float) -> float:
        """Requests/s one instance takes with its latency quantile at the SLO (0: unreachable)."""
        base, mu = self.curve()
        return 0.0 if slo_s <= base else mu * (1 - base / slo_s)


def update(fit: Fit, rate_per_instance: float, latency_s: float | None) -> Fit:
    """The fit after one interval of one pool (rate per serving instance, measured quantile)."""
    if latency_s is None or not LATENCY_RANGE[0] <= latency_s <= LATENCY_RANGE[1]:
        return fit  # also NaN: every comparison with it is false
    if not 0 < rate_per_instance <= MAX_RATE:
        return fit
    x, y = rate_per_instance, 1 / latency_s
    w, sx, sy, sxx, sxy = (FORGET * s for s in fit.sums)
    sums = (w + 1, sx + x, sy + y, sxx + x * x, sxy + x * y)
    return replace(fit, sums=sums, samples=fit.samples + 1)


def prior_decode(itl_base_s: float, itl_per_request_s: float, output_tokens: float) -> Fit:
    """Decode's curve from its step cost (``a + b * running``) and the mean output length."""
    return Fit(base_s=itl_base_s, mu=1.0 / (itl_per_request_s * output_tokens))


def prior_prefill(prompt_tokens: float, prefill_tokens_per_s: float) -> Fit:
    """A prefill server's curve: one prompt's compute time, served one batch after another."""
    service = prompt_tokens / prefill_tokens_per_s
    return Fit(base_s=service, mu=1.0 / service)
