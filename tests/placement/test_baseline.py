"""Our DeepSeek EPLB re-implementation behaves as its description says."""

import numpy as np

from moe_placement import baseline_plan, gpu_loads
from moe_placement.layout import expert_counts

TOY = np.array([[600.0, 560, 120, 120, 20, 10, 10, 10]])


def test_toy_case_reaches_the_published_232() -> None:
    phy2log = baseline_plan(TOY, num_gpus=8, num_redundant=8)
    assert gpu_loads(phy2log, TOY, 8).max() == 232.0


def test_replication_is_greedy_on_tokens_per_copy() -> None:
    phy2log = baseline_plan(TOY, num_gpus=8, num_redundant=8)
    np.testing.assert_array_equal(expert_counts(phy2log, 8)[0], [5, 5, 1, 1, 1, 1, 1, 1])


def test_hierarchical_keeps_groups_and_their_copies_on_one_node() -> None:
    rng = np.random.default_rng(0)
    loads = rng.gamma(0.5, 100.0, size=(3, 32))
    phy2log = baseline_plan(loads, num_gpus=8, num_nodes=2, num_redundant=8, num_groups=4)
    node = np.arange(40) // 20
    group = phy2log // 8
    for layer in range(3):
        for g in range(4):
            assert len(set(node[group[layer] == g])) == 1


def test_history_is_summed_like_sglang() -> None:
    rng = np.random.default_rng(1)
    hist = rng.gamma(0.5, 100.0, size=(5, 2, 16))
    np.testing.assert_array_equal(
        baseline_plan(hist, num_gpus=4, num_redundant=4),
        baseline_plan(hist.sum(0), num_gpus=4, num_redundant=4),
    )
