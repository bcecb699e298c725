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


def test_kv_room_binds_before_compute_and_a_larger_pool_relieves_it() -> None:
    """Long prompts at a fixed rate: a small KV pool (a narrow instance) fills while compute idles,
    requests queue and the first token waits, token usage sits near 1; four times the pool (a
    wider instance holds more KV per GPU) serves the same load with no queue."""
    narrow = 32 * (8192 + 128)
    runs = {}
    for kv in (narrow, 4 * narrow):
        model = LoadModel(
            LoadConfig(request_rate=6.0, prompt_tokens=8192, kv_tokens=kv), "decode", BUCKETS, now=0.0
        )
        run(model, 0.0, 90.0)
        obs, snap = model.observed_copy(), model.snapshot()
        runs[kv] = (snap, quantile(obs.ttft[True], 0.9), quantile(obs.itl, 0.9))
        assert model.reserved <= kv  # admission never over-commits the pool
    (tight, ttft_tight, itl_tight), (roomy, ttft_roomy, itl_roomy) = runs[narrow], runs[4 * narrow]
    print(f"narrow: {tight}, p90 TTFT {ttft_tight:.2f} s, ITL {itl_tight:.3f} s")
    print(f"wide:   {roomy}, p90 TTFT {ttft_roomy:.2f} s, ITL {itl_roomy:.3f} s")
    assert tight.token_usage > 0.8 and tight.queued > 50 and tight.running < 64  # KV full, batch not
    assert itl_tight <= itl_roomy and ttft_tight > 3 * ttft_roomy  # compute is fine; the wait is for KV
    assert roomy.queued < 5 and roomy.token_usage < 0.5


def test_token_usage_counts_what_running_requests_hold_and_returns_to_zero() -> None:
    model = LoadModel(
        LoadConfig(request_rate=4.0, max_running=8, kv_tokens=10**9), "decode", BUCKETS, now=0.0
    )
    t = run(model, 0.0, 20.0)
    busy = model.snapshot()
    held = sum(prompt + model.passes - first for _, _, _, prompt, first in model.running)
    assert busy.running > 0 and busy.token_usage == pytest.approx(held / 10**9)
    model.set_rate(0.0)
    run(model, t, 120.0)
    assert model.snapshot().running == 0 and model.snapshot().token_usage == 0.0
    assert model.reserved == 0 and model.held_base == 0


def test_a_request_longer_than_the_pool_is_refused_on_arrival_not_queued_forever() -> None:
    model = LoadModel(
        LoadConfig(request_rate=0.5, prompt_tokens=4096, kv_tokens=8192), "decode", BUCKETS, now=0.0
    )
    run(model, 0.0, 120.0)
    finished = model.observed_copy().finished
    assert model.too_long >= 2  # about one prompt in eight of mean 4096 tokens exceeds 8192 with its output
    assert finished[True] + finished[False] > 30 and model.snapshot().queued < 5
