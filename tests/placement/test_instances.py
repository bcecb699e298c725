"""One plan per instance from its own windows, with the pool's as a prior."""

import numpy as np
import pytest

from moe_placement import plan_instances
from moe_placement.layout import expert_counts


def test_every_instance_gets_a_valid_map_within_its_cap() -> None:
    rng = np.random.default_rng(0)
    base = rng.gamma(0.5, 50.0, size=(1, 2, 16))
    histories = {f"i{k}": rng.poisson(base, size=(8, 2, 16)).astype(float) for k in range(3)}
    kw = {"num_gpus": 4, "num_redundant": 4, "dispatch": "dynamic", "horizon": 1}
    first = plan_instances(histories, **kw)
    assert set(first) == set(histories)
    for p in first.values():
        assert p.physical_to_logical_map.shape == (2, 20)
        assert (expert_counts(p.physical_to_logical_map, 16) >= 1).all()
    currents = {k: p.physical_to_logical_map for k, p in first.items()}
    again = plan_instances(histories, currents=currents, max_moves=3, **kw)
    assert all(p.moved_slots <= 3 for p in again.values())


def test_histories_must_line_up() -> None:
    with pytest.raises(ValueError, match="same shape"):
        plan_instances({"a": np.ones((4, 2, 8)), "b": np.ones((3, 2, 8))}, num_gpus=4)
    with pytest.raises(ValueError, match="at least one"):
        plan_instances({}, num_gpus=4)
    with pytest.raises(ValueError, match="prior must have"):
        plan_instances({"a": np.ones((4, 2, 8))}, pool=np.ones((5, 2, 8)), num_gpus=4)
