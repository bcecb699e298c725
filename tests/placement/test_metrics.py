"""The balance metric and the dispatch rules it models."""

import numpy as np
import pytest

from moe_placement import balancedness, gpu_loads
from moe_placement.metrics import slot_shares


def static_shares_by_rank(phy2log: np.ndarray, num_experts: int, num_gpus: int, num_nodes: int) -> np.ndarray:
    """SGLang 0.5.23's static rule, rank by rank (expected value of the seeded fair draw)."""
    num_slots = phy2log.size
    per_gpu, per_node = num_slots // num_gpus, num_gpus // num_nodes
    shares = np.zeros(num_slots)
    for e in range(num_experts):
        cands = [p for p in range(num_slots) if phy2log[p] == e]
        fair = []
        for rank in range(num_gpus):
            if len(cands) == 1:
                shares[cands[0]] += 1
                continue
            same_gpu = [p for p in cands if p // per_gpu == rank]
            same_node = [p for p in cands if p // (per_gpu * per_node) == rank // per_node]
            if same_gpu:
                shares[same_gpu[0]] += 1
            elif 0 < len(same_node) < len(cands):
                shares[same_node[0]] += 1
            else:
                fair.append(rank)
        for p in cands:
            shares[p] += len(fair) / len(cands)
    return shares / num_gpus


@pytest.mark.parametrize("seed", range(20))
def test_static_model_matches_rank_by_rank_rule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_experts, num_gpus, num_nodes, per_gpu = 6, 8, 2, 2
    phy2log = np.concatenate(
        [np.arange(num_experts), rng.integers(0, num_experts, num_gpus * per_gpu - num_experts)]
    )
    rng.shuffle(phy2log)
    got = slot_shares(phy2log[None], num_experts, num_gpus, "static", num_nodes)[0]
    np.testing.assert_allclose(got, static_shares_by_rank(phy2log, num_experts, num_gpus, num_nodes))


def test_dynamic_splits_evenly_and_balancedness_is_sglangs() -> None:
    phy2log = np.array([[0, 1, 0, 2]])  # expert 0 on both GPUs
    loads = np.array([[100.0, 20.0, 60.0]])
    np.testing.assert_allclose(gpu_loads(phy2log, loads, 2), [[70.0, 110.0]])
    np.testing.assert_allclose(balancedness(phy2log, loads, 2), [(90 + 1e-5) / (110 + 1e-5)])


def test_static_copies_on_two_nodes_of_unequal_size_split_unevenly() -> None:
    # 4 GPUs, 2 nodes, one slot each; expert 0 has two copies on node 0 and one on node 1
    phy2log = np.array([[0, 0, 0, 1]])
    shares = slot_shares(phy2log, 2, 4, "static", 2)[0]
    # node 0's ranks use their own copies; node 1's rank 3 uses node 1's copy (GPU 2)
    np.testing.assert_allclose(shares[:3], [0.25, 0.25, 0.5])


def test_loads_with_a_step_axis() -> None:
    phy2log = np.array([[0, 1], [1, 0]])
    loads = np.arange(12.0).reshape(3, 2, 2)
    out = gpu_loads(phy2log, loads, 2)
    assert out.shape == (3, 2, 2)
    np.testing.assert_allclose(out[:, 1], loads[:, 1, ::-1])
