"""From instances' intervals to the pool's: what the decision reads, and who is idle.

Only instances on the router's list count toward the pool's rate and latency (one being
drained or still booting serves no new requests). A prefill server does not observe time to
first token (SGLang measures it on the decode server that streams the first token), so a P/D
prefill pool's TTFT is read from its decode pool's instances. While a width change rolls, the
pool's instances run at two widths: their requests all count, but the interval does not teach
the curve (which is per instance of one width).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from .decide import Objective, PoolObservation
from .signals import InstanceSample, merged

MIN_OBSERVATIONS = 20  # fewer requests in an interval say little about a percentile


def _quantile(samples: list[InstanceSample], metric: str, q: float) -> float | None:
    h = merged([s.ttft if metric == "ttft" else s.itl for s in samples])
    if h is None or h.counts[-1] < MIN_OBSERVATIONS:
        return None
    return h.quantile(q)


def pool_observation(
    at: float,
    samples: Mapping[int, InstanceSample],
    serving: int,
    objectives: tuple[Objective, ...],
    ttft_from: Mapping[int, InstanceSample] | None = None,
    at_width: Collection[int] | None = None,
    ttft_at_width: Collection[int] | None = None,
    off: int | None = None,
) -> PoolObservation | None:
    """The pool over the interval; None when no serving instance gave a usable interval.
    ``at_width``: the instances running at the pool's current width (None: all of them);
    ``ttft_at_width``: the same for the instances in ``ttft_from``; ``off``: an instance of the
    first ``serving`` that is off the router (a width change drains it)."""
    listed = [i for i in samples if i < serving and i != off]
    mine = [samples[i] for i in listed]
    if not mine:
        return None
    latency: dict[str, float | None] = {}
    for o in objectives:
        source = list(ttft_from.values()) if o.metric == "ttft" and ttft_from is not None else mine
        latency[o.metric] = _quantile(source, o.metric, o.quantile)
    return PoolObservation(
        at=at,
        serving=len(mine),
        rate=sum(s.rate for s in mine),
        latency=latency,
        token_usage=sum(s.token_usage for s in mine) / len(mine),
        queued=sum(s.queued for s in mine),
        one_width=(at_width is None or all(i in at_width for i in listed))
        and (ttft_from is None or ttft_at_width is None or all(i in ttft_at_width for i in ttft_from)),
    )


def idle(samples: Mapping[int, InstanceSample]) -> frozenset[int]:
    """Instances with nothing running, queued or in a P/D KV hand-off: a drained one may go."""
    return frozenset(i for i, s in samples.items() if s.running == 0 and s.queued == 0 and s.handoff == 0)
