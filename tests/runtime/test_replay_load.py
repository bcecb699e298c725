"""The replay engine's load model on a simulated clock: latency as a function of offered load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moe_runtime.replay.load import Histogram, LoadConfig, LoadModel
from moe_runtime.replay.sglang_metrics import BUCKETS


def quantile(h: Histogram, q: float) -> float:
    """Prometheus' histogram_quantile on one histogram."""
    cum = np.cumsum(h.counts)
    rank = q * cum[-1]
    i = int(np.searchsorted(cum, rank))
    upper = h.uppers[i]
    lower = h.uppers[i - 1] if i else 0.0
    below = cum[i - 1] if i else 0
    if math.isinf(upper):
        return float(lower)
    return float(lower + (upper - lower) * (rank - below) / max(cum[i] - below, 1))


def run(model: LoadModel, start: float, seconds: float, step: float = 0.5) -> float:
    t = start
    while t < start + seconds:
        t += step
        model.advance(t)
    return t


def delta(after: Histogram, before: Histogram) -> Histogram:
    out = Histogram(after.bounds)
    out.counts = after.counts - before.counts
    return out


def test_latency_rises_with_offered_load_and_the_queue_grows_past_capacity() -> None:
    model = LoadModel(LoadConfig(request_rate=2.0), "decode", BUCKETS, now=0.0)
    t = run(model, 0.0, 120.0)
    calm = model.observed_copy()
    ttft_calm = quantile(calm.ttft[True], 0.95)
    itl_calm = quantile(calm.itl, 0.95)
    assert ttft_calm < 0.5 and itl_calm < 0.06, (ttft_calm, itl_calm)
    assert model.snapshot().queued == 0

    model.set_rate(16.0)  # twice the capacity of one instance
    run(model, t, 60.0)
    busy = model.observed_copy()
    ttft_busy = quantile(delta(busy.ttft[True], calm.ttft[True]), 0.95)
    itl_busy = quantile(delta(busy.itl, calm.itl), 0.95)
    print(f"p95 TTFT {ttft_calm:.3f} -> {ttft_busy:.3f} s, p95 ITL {itl_calm:.3f} -> {itl_busy:.3f} s")
    assert ttft_busy > 2.0 and itl_busy > 0.1  # the shipped alert thresholds
    snap = model.snapshot()
    assert snap.running >= 120 and snap.queued > 100 and snap.gen_throughput > 0
    # finished requests keep being counted, by streaming
    assert busy.finished[True] > calm.finished[True] > 0 and busy.finished[False] > 0


def test_a_prefill_server_observes_no_first_token_only_finished_requests() -> None:
    model = LoadModel(LoadConfig(request_rate=5.0), "prefill", BUCKETS, now=0.0)
    run(model, 0.0, 30.0)
    obs = model.observed_copy()
    assert not obs.ttft[True].counts.any() and not obs.ttft[False].counts.any()
    assert not obs.itl.counts.any()
    assert obs.e2e[True].counts.sum() == obs.finished[True] > 0


def test_offered_load_is_bounded_and_finite() -> None:
    model = LoadModel(LoadConfig(), "standalone", BUCKETS, now=0.0)
    for bad in (-1.0, math.nan, math.inf, 1e9):
        with pytest.raises(ValueError, match="request rate"):
            model.set_rate(bad)
    model.set_rate(0.0)
    run(model, 0.0, 10.0)
    assert model.observed_copy().finished == {True: 0, False: 0}
