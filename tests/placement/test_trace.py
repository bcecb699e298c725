"""Synthetic traces: seeded, shaped, and calibrated to the measured routing skew."""

import numpy as np

from moe_placement import TraceConfig, generate_trace


def test_same_seed_same_trace_and_shapes() -> None:
    cfg = TraceConfig(num_layers=3, num_experts=16, num_steps=40, tokens_per_step=256, seed=7)
    a, b = generate_trace(cfg), generate_trace(cfg)
    np.testing.assert_array_equal(a.counts, b.counts)
    assert a.counts.shape == (40, 3, 16)
    assert a.mix.shape == (40, 4) and np.allclose(a.mix.sum(1), 1)
    assert not np.array_equal(a.counts, generate_trace(TraceConfig(**{**cfg.__dict__, "seed": 8})).counts)


def test_skew_matches_the_olmoe_measurements() -> None:
    trace = generate_trace(TraceConfig(num_layers=16, num_experts=64, num_steps=8))
    peak = trace.popularity.max(-1) * 64  # busiest expert / fair share, [domain, layer]
    prose, code = peak[0], peak[1]
    assert prose.min() >= 2.2 - 1e-6 and prose.max() <= 4.2 + 1e-6  # 2.2x-4.2x across layers
    assert 2.7 <= np.median(prose) <= 3.5  # 3.1x typical
    assert 6.0 <= np.median(code) <= 7.3  # 6.9x (capped: an expert is picked once per token, top-8 of 64)


def test_counts_add_up_to_tokens_times_top_k() -> None:
    cfg = TraceConfig(num_layers=2, num_experts=32, num_steps=50, tokens_per_step=1000, top_k=4)
    counts = generate_trace(cfg).counts
    assert abs(counts.sum(-1).mean() / 4000 - 1) < 0.02


def test_traffic_mix_drifts_and_layers_move_together() -> None:
    cfg = TraceConfig(num_layers=4, num_experts=32, num_steps=600, walk_steps=100.0, walk_sigma=1.5)
    trace = generate_trace(cfg)
    assert np.abs(trace.mix[-100:].mean(0) - trace.mix[:100].mean(0)).max() > 0.05
    code = trace.popularity[1].argmax(-1)  # code's hottest expert in each layer
    series = trace.counts[:, np.arange(4), code]
    corr = np.asarray(np.corrcoef(series.T))
    assert corr[np.triu_indices(4, 1)].mean() > 0.3  # driven by the shared mix
