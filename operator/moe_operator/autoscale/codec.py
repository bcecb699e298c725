"""The autoscaler's state in status and back: written by the operator, read as untrusted.

Anyone allowed to write the status subresource could put anything there, so reading it back
checks every number (finite, in range, bounded lengths) and falls back to a fresh state with
a note rather than trusting or failing on it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .decide import HISTORY_S, PoolDecision, PoolObservation, PoolState
from .model import Fit
from .scale import Scale, Step

MAX_RATES = 480  # two hours of 15 s ticks
MAX_MODEL_CHARS = 16384
MAX_NUMBER = 1e12  # rates, queue and surge in the stored model
MAX_GPUS = 128 * 16  # GPUs per instance: nodesPerReplica (at most 128) x gpusPerNode (at most 16)
METRICS = ("ttft", "itl")


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _num(value: Any, low: float = 0.0, high: float = 1e12) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    try:
        number = float(value)  # a JSON integer of hundreds of digits does not fit a float
    except OverflowError:
        raise ValueError("not a finite number") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    if not low <= number <= high:
        raise ValueError(f"{number} outside [{low}, {high}]")
    return number


def _fit(raw: Any) -> Fit:
    if not isinstance(raw, list) or len(raw) != 8:
        raise ValueError("a fit is 8 numbers")
    base, mu = _num(raw[0], 1e-6, 3600), _num(raw[1], 1e-9, 1e9)
    w = _num(raw[2], 0, 1e6)
    sums = (
        w,
        _num(raw[3], -1e15, 1e15),
        _num(raw[4], -1e15, 1e15),
        _num(raw[5], 0, 1e15),
        _num(raw[6], -1e15, 1e15),
    )
    return Fit(base_s=base, mu=mu, sums=sums, samples=int(_num(raw[7], 0, 1e12)))


def read_model(text: str, metrics: tuple[str, ...], now: float) -> PoolState | None:
    """The decision state kept in status, or None when absent or not to be trusted."""
    if not text or len(text) > MAX_MODEL_CHARS:
        return None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            return None
        fits_raw = doc.get("fits") or {}
        if not isinstance(fits_raw, dict) or set(fits_raw) != set(metrics):
            return None  # the targets changed: start the model again
        fits = {m: _fit(fits_raw[m]) for m in metrics}
        rates_raw = doc.get("rates") or []
        if not isinstance(rates_raw, list) or len(rates_raw) > MAX_RATES:
            return None
        pairs = [
            (_num(p[0], 0, now + 60), _num(p[1], 0, MAX_NUMBER))
            for p in rates_raw
            if isinstance(p, list) and len(p) == 2
        ]
        rates = tuple((t, r) for t, r in pairs if t >= now - HISTORY_S)  # an outage ages rates, not the fit
        if any(b[0] < a[0] for a, b in itertools.pairwise(rates)):
            return None

        def opt(key: str) -> float | None:
            v = doc.get(key)
            return None if v is None else _num(v, 0, now + 60)

        return PoolState(
            instances=0,
            fits=fits,
            rates=rates,
            last_out=opt("lastOut"),
            last_in=opt("lastIn"),
            queued=_num(doc.get("queued", 0.0), 0, MAX_NUMBER),
            surge=_num(doc.get("surge", 0.0), 0, MAX_NUMBER),
            gpus=int(_num(doc.get("gpus", 0), 0, MAX_GPUS)),
        )
    except (ValueError, TypeError, IndexError, RecursionError, ArithmeticError):
        return None


def write_model(state: PoolState) -> str:
    doc = {
        "fits": {m: [f.base_s, f.mu, *f.sums, f.samples] for m, f in sorted(state.fits.items())},
        # clamped to what read_model accepts, so the operator never rejects its own state
        "rates": [[round(t, 1), round(min(r, MAX_NUMBER), 4)] for t, r in state.rates[-MAX_RATES:]],
        "lastOut": state.last_out,
        "lastIn": state.last_in,
        "queued": round(min(state.queued, MAX_NUMBER), 3),
        "surge": round(min(state.surge, MAX_NUMBER), 4),
        "gpus": min(state.gpus, MAX_GPUS),
    }
    return json.dumps(doc, separators=(",", ":"))


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 256:
        raise ValueError("not an instance count")
    return value


def read_scale(
    raw: Mapping[str, Any], fallback: Scale, lo: int, hi: int, now: float, horizon_s: float, existing: int = 0
) -> Scale:
    """The pool's size as status holds it; the fallback when it does not check out.

    At least ``lo``; above ``hi`` only as far as instances already exist (``existing``: a lowered
    maxReplicas is drained down one instance at a time, while a tampered status cannot create
    groups past it). Times later than ``now`` (a rollback's pause: ``now + horizon_s``) are not
    the operator's: a tampered far-future time would otherwise pause growth or hold a drain open.
    """
    try:
        instances, serving = _count(raw["instances"]), _count(raw["serving"])
    except (KeyError, ValueError, TypeError):
        return fallback
    if not 1 <= serving <= instances:
        return fallback

    def when(key: str, ahead: float = 60.0) -> float | None:
        t = _epoch(raw.get(key))
        return t if t is not None and t <= now + ahead else None

    pending = when("pendingSince")
    draining = raw.get("reason") == "draining" and instances - serving == 1 and pending is not None
    draining = draining and lo <= serving
    instances = min(max(instances, lo), max(hi, min(existing, instances)))
    serving = min(serving, instances)
    rolling = raw.get("rollingInstance")
    since = when("rollingSince")
    # a width roll's instance: a listed one, never alongside a scale-in's drain, with its time
    if isinstance(rolling, bool) or not isinstance(rolling, int) or not 0 <= rolling < serving:
        rolling = None
    if draining or since is None:
        rolling = None
    waiting, reported = when("widthWaitingSince"), when("widthWaitingReported")
    if waiting is None or (reported is not None and reported < waiting):
        reported = None
    return Scale(
        instances=instances,
        serving=serving,
        pending_since=pending,
        last_change=when("lastScaleTime"),
        blocked_until=when("blockedUntil", horizon_s + 60.0),
        draining=draining,
        rolling=rolling,
        released=rolling is not None and raw.get("rollingReleased") is True,
        rolling_spec=rolling is not None and raw.get("rollingSpec") is True,
        rolling_since=since if rolling is not None else None,
        waiting_since=waiting,
        waiting_reported=reported,
    )


def read_time(value: Any) -> float | None:
    """An RFC 3339 time in seconds (the form Kubernetes writes), None when it is not one."""
    return _epoch(value)


def read_retry(raw: Mapping[str, Any], now: float, horizon_s: float) -> float | None:
    """widthRetryAfter, when it is ahead of ``now`` by at most ``horizon_s`` (a tampered far-future
    time would otherwise hold every width change)."""
    t = _epoch(raw.get("widthRetryAfter"))
    return t if t is not None and now < t <= now + horizon_s + 60.0 else None


def read_failures(raw: Mapping[str, Any]) -> int:
    """widthFailures: chosen widths in a row that did not come up (0 when absent or out of range)."""
    n = raw.get("widthFailures")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 64 else 0


def read_indexes(status: Mapping[str, Any], pool: str, key: str) -> frozenset[int]:
    """A list of instances the reconciler keeps in status.pools.<pool> (``key``: widthBlocked,
    outdated): instance indexes, anything else dropped."""
    pools = status.get("pools")
    raw = (pools.get(pool) if isinstance(pools, Mapping) else None) or {}
    items = raw.get(key) if isinstance(raw, Mapping) else None
    if not isinstance(items, list):
        return frozenset()
    return frozenset(
        i for i in items[:256] if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 256
    )


def write_time(t: float | None) -> str | None:
    return _iso(t)


def write_pool(
    scale: Scale, step: Step, decision: PoolDecision, obs: PoolObservation | None
) -> dict[str, Any]:
    reason = step.reason or decision.reason
    message = step.message or decision.message
    out: dict[str, Any] = {
        "instances": scale.instances,
        "serving": scale.serving,
        "need": max(0, min(decision.need, 1_000_000)),
        "reason": reason[:32],
        "message": message[:2048],
        "lastScaleTime": _iso(scale.last_change),
        "pendingSince": _iso(scale.pending_since),
        "blockedUntil": _iso(scale.blocked_until),
        # None removes the fields once the roll is over (status is merge-patched)
        "rollingInstance": scale.rolling,
        "rollingReleased": scale.released if scale.rolling is not None else None,
        "rollingSince": _iso(scale.rolling_since) if scale.rolling is not None else None,
        "rollingSpec": True if scale.rolling is not None and scale.rolling_spec else None,
        "widthWaitingSince": _iso(scale.waiting_since),
        "widthWaitingReported": _iso(scale.waiting_reported),
        "model": write_model(decision.state),
    }
    if obs is not None and decision.reason != "no_data":
        n = decision.numbers
        numbers = {
            "offeredRate": n.get("offeredRate"),
            "forecastRate": n.get("forecastRate"),
            "tokenUsage": obs.token_usage,
            "ratePerInstance": min((v for k, v in n.items() if k.endswith("RatePerInstance")), default=None),
        }
        # None removes a stale value (status is merge-patched)
        out.update({k: round(v, 4) if v is not None and _fine(v) else None for k, v in numbers.items()})
        out["latency"] = {m: round(v, 6) for m, v in obs.latency.items() if v is not None and _fine(v)}
        out["recommendedNodesPerReplica"] = decision.width.nodes if decision.width is not None else None
    return out


def _fine(v: float) -> bool:
    """A number the status schema takes (and JSON can carry): finite and non-negative."""
    return math.isfinite(v) and 0 <= v <= 1e12
