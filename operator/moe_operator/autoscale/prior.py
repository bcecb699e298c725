"""Where a pool's model starts before it has measured anything.

Without profiles of this model on this hardware, the honest starting point is the pool its
author sized: it is taken to meet its SLO at its current load with room to spare, the no-load
latency a third of the target and the current rate per instance half the divergence rate.
The fit leaves this prior as soon as the load moves (model.py weighs it as 20 intervals).
"""

from __future__ import annotations

from dataclasses import replace

from .decide import PoolObservation, PoolPolicy, PoolState
from .model import Fit

MIN_MU = 0.01  # requests/s: a placeholder for an idle pool, replaced at its first load


def prior(policy: PoolPolicy, obs: PoolObservation | None) -> dict[str, Fit]:
    per = obs.rate / obs.serving if obs is not None and obs.serving else 0.0
    return {o.metric: Fit(base_s=o.slo_s / 3, mu=max(2 * per, MIN_MU)) for o in policy.objectives}


def seeded(fits: dict[str, Fit], policy: PoolPolicy, obs: PoolObservation | None) -> dict[str, Fit]:
    """The fits, with any that never saw load replaced by the prior of this observation. While the
    pool's instances run at two widths (the fits do not learn then), a prior already set is kept:
    re-anchored on every interval it would follow the load, and no load would ever look like more
    than the pool can take."""
    fresh = prior(policy, obs)
    anchor = obs is None or obs.one_width
    return {m: (fresh[m] if (anchor and f.samples == 0) or f.mu <= MIN_MU else f) for m, f in fits.items()}


def resume(
    stored: PoolState | None, policy: PoolPolicy, obs: PoolObservation | None, instances: int
) -> PoolState:
    """The state a decision goes on from. Fits measured on instances of another width (the width
    changed) start over from the prior; the pool's rates and surge stay, since they count requests
    whatever the width."""
    if stored is None or stored.gpus not in (0, policy.width.gpus):
        stored = replace(stored or PoolState(instances, {}), fits=prior(policy, obs))
    return replace(stored, instances=instances, fits=seeded(stored.fits, policy, obs), gpus=policy.width.gpus)
