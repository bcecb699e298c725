"""The bench's protocol on tiny cases: what is scored, against what, and the move cap.

Small sizes keep the suite fast; `moe-operator eplb bench` runs the real tables. Only
margins far outside the noise are asserted (real prefill routing, where the baseline
balances the average and the planner hedges the per-step mix).
"""

import numpy as np

from moe_placement.bench import MOVE_SHARE, rebalance_points, run_case, step_samples, window_sums
from moe_placement.regimes import REAL, REAL_SETUPS, SETUPS, real_counts, synthetic_counts


def test_windows_and_samples_are_taken_before_the_rebalance() -> None:
    counts = np.arange(40.0)[:, None, None] * np.ones((1, 1, 2))
    sums = window_sums(counts, 30, 10, count=2)
    np.testing.assert_array_equal(sums[:, 0, 0], [sum(range(10, 20)), sum(range(20, 30))])
    np.testing.assert_array_equal(step_samples(counts, 20, 10, count=4)[:, 0, 0], [20, 23, 26, 29])
    assert rebalance_points(8 * 10 + 25, 10) == [80, 90]


def test_real_prefill_beats_the_baseline_and_the_cap_holds() -> None:
    mode = "prefill"
    counts = real_counts(mode, "walk", windows=8 + 3, seed=1)
    row = run_case(counts, REAL[mode].window, REAL_SETUPS["R8"], regime="prefill-walk", seed=1)
    assert row.ours.excess < 0.8 * row.base.excess
    assert row.oracle.excess < row.base.excess
    for k, moved in enumerate(row.capped.moves):
        assert moved <= int(MOVE_SHARE * row.base.moves[k]) or k == 0
    assert sum(row.rules.values()) == 3


def test_windows_only_input_runs_without_step_samples() -> None:
    setup = SETUPS["EP8"]
    counts = synthetic_counts(setup, "fast", window=16, steps=10 * 16, layers=2, seed=1)
    row = run_case(counts, 16, setup, regime="fast", seed=1, inputs="windows")
    assert len(row.base.moves) == 2 and row.base.excess > 0 and row.ours.excess > 0
