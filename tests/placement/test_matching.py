"""Matching new GPU contents to old ones: exact, and free for balance."""

import itertools

import numpy as np

from moe_placement.layout import make_layout
from moe_placement.matching import hungarian, match_to_current
from moe_placement.metrics import gpu_loads
from moe_placement.one_slot import keep_positions


def test_hungarian_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4, 6):
        cost = rng.integers(0, 9, size=(15, n, n)).astype(float)
        assign = hungarian(cost)
        for b in range(15):
            best = min(sum(cost[b, i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
            assert sorted(assign[b]) == list(range(n))
            assert sum(cost[b, i, assign[b, i]] for i in range(n)) == best


def test_one_slot_matching_keeps_every_expert_it_can() -> None:
    rng = np.random.default_rng(1)
    old = rng.integers(0, 5, size=(30, 9))
    new = rng.integers(0, 5, size=(30, 9))
    out = keep_positions(new, old)
    for r in range(30):
        assert sorted(out[r]) == sorted(new[r])
        assert (out[r] == old[r]).sum() == sum(
            min((new[r] == e).sum(), (old[r] == e).sum()) for e in range(5)
        )


def test_matching_changes_no_gpu_load_and_finds_a_permuted_copy() -> None:
    rng = np.random.default_rng(2)
    layout = make_layout(3, 16, num_gpus=4, num_redundant=4)
    current = np.stack(
        [rng.permutation(np.concatenate([np.arange(16), rng.integers(0, 16, 4)])) for _ in range(3)]
    )
    perm = current.reshape(3, 4, 5)[:, rng.permutation(4)][:, :, rng.permutation(5)].reshape(3, 20)
    matched = match_to_current(perm, current, layout, "dynamic")
    np.testing.assert_array_equal(matched, current)  # a pure relabelling costs no move at all
    loads = rng.gamma(1.0, 10.0, size=(3, 16))
    other = np.stack([rng.permutation(current[layer]) for layer in range(3)])
    matched = match_to_current(other, current, layout, "dynamic")
    np.testing.assert_allclose(
        np.sort(gpu_loads(matched, loads, 4), axis=1), np.sort(gpu_loads(other, loads, 4), axis=1)
    )
    assert (matched != current).sum() <= (other != current).sum()
