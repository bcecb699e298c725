"""The numpy placement core against brute-force references (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest

from moe_placement.maps import (
    PlacementError,
    balancedness,
    expert_count,
    gpu_loads,
    logical_to_all_physical,
    max_over_mean,
    slot_shares,
    trivial_map,
    validate_map,
)


def random_map(rng: np.random.Generator, layers: int, experts: int, slots: int) -> np.ndarray:
    rows = []
    for _ in range(layers):
        extra = rng.integers(0, experts, size=slots - experts)
        rows.append(rng.permutation(np.concatenate([np.arange(experts), extra])))
    return np.stack(rows).astype(np.int64)


def test_trivial_map_wraps_redundant_slots() -> None:
    m = trivial_map(2, 4, 6)
    assert m.tolist() == [[0, 1, 2, 3, 0, 1]] * 2


def test_expert_count_and_log2phy_match_brute_force() -> None:
    rng = np.random.default_rng(0)
    m = random_map(rng, 5, 16, 24)
    counts = expert_count(m, 16)
    l2p = logical_to_all_physical(m, 16)
    assert l2p.shape == (5, 16, int(counts.max()))
    for layer in range(5):
        for e in range(16):
            slots = [p for p in range(24) if m[layer, p] == e]
            assert counts[layer, e] == len(slots)
            row = l2p[layer, e].tolist()
            assert row == slots + [-1] * (l2p.shape[-1] - len(slots))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([[0, 1, 2, 2]], "drops"),
        ([[0, 1, 2, 4]], "in [0, 4)"),
        ([[0, 1, 2]], "slots per layer"),
        ([0, 1, 2, 3], "2-D"),
        ([[0, 1], [2, 3, 0]], "rectangular"),
        ([[0.5, 1, 2, 3]], "integers"),
    ],
)
def test_validate_map_refuses_unsafe_maps(bad: object, message: str) -> None:
    with pytest.raises(PlacementError, match=message.replace("[", r"\[").replace(")", r"\)")):
        validate_map(bad, num_layers=1, num_logical=4, num_physical=4)


def test_validate_map_checks_layers_and_gpus() -> None:
    m = trivial_map(3, 8, 12)
    assert validate_map(m, num_layers=3, num_logical=8, num_physical=12, num_gpus=4).shape == (3, 12)
    with pytest.raises(PlacementError, match="layers"):
        validate_map(m, num_layers=4, num_logical=8, num_physical=12)
    with pytest.raises(PlacementError, match="GPUs"):
        validate_map(m, num_layers=3, num_logical=8, num_physical=12, num_gpus=5)


def _static_reference(m: np.ndarray, experts: int, gpus: int, gpn: int | None) -> np.ndarray:
    """Port of SGLang's compute_logical_to_rank_dispatch_physical_map, expectation of fair choices."""
    layers, slots = m.shape
    per_gpu = slots // gpus
    share = np.zeros((layers, slots))
    for layer in range(layers):
        for e in range(experts):
            cand = [p for p in range(slots) if m[layer, p] == e]
            for rank in range(gpus):
                if len(cand) == 1:
                    share[layer, cand[0]] += 1
                    continue
                same_gpu = [p for p in cand if p // per_gpu == rank]
                if same_gpu:
                    share[layer, same_gpu[0]] += 1
                    continue
                if gpn:
                    same_node = [p for p in cand if p // (per_gpu * gpn) == rank // gpn]
                    if 0 < len(same_node) < len(cand):
                        share[layer, same_node[0]] += 1
                        continue
                for p in cand:
                    share[layer, p] += 1 / len(cand)
    return share / gpus


@pytest.mark.parametrize("gpn", [None, 2])
def test_static_shares_follow_sglang_dispatch(gpn: int | None) -> None:
    rng = np.random.default_rng(1)
    m = random_map(rng, 4, 12, 16)
    got = slot_shares(m, 12, 8, dispatch="static", gpus_per_node=gpn)
    np.testing.assert_allclose(got, _static_reference(m, 12, 8, gpn))


def test_shares_sum_to_one_per_expert() -> None:
    rng = np.random.default_rng(2)
    m = random_map(rng, 3, 10, 16)
    for dispatch in ("static", "dynamic"):
        shares = slot_shares(m, 10, 4, dispatch=dispatch)  # type: ignore[arg-type]
        for layer in range(3):
            per_expert = np.bincount(m[layer], weights=shares[layer], minlength=10)
            np.testing.assert_allclose(per_expert, 1.0)


def test_balancedness_is_sglangs_formula() -> None:
    m = trivial_map(1, 4, 4)
    loads = np.array([[30.0, 10.0, 10.0, 10.0]])
    gpu = gpu_loads(loads, m, slot_shares(m, 4, 2, dispatch="dynamic"), 2)
    assert gpu.tolist() == [[40.0, 20.0]]
    assert balancedness(gpu)[0] == pytest.approx((30 + 1e-5) / (40 + 1e-5))
    assert max_over_mean(gpu)[0] == pytest.approx(40 / 30)
    assert max_over_mean(np.zeros((1, 2)))[0] == 1.0
