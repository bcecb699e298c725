"""Inputs are checked once, with errors that say what is wrong."""

import numpy as np
import pytest

from moe_placement import baseline_plan, plan

LOADS = np.ones((2, 8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_gpus": 3, "num_redundant": 0}, "do not divide over 3 GPUs"),
        ({"num_gpus": 4, "num_nodes": 3}, "4 GPUs do not divide over 3 nodes"),
        ({"num_gpus": 4, "num_groups": 3}, "do not divide into 3 groups"),
        ({"num_gpus": 0}, "num_gpus must be >= 1"),
        ({"num_gpus": 4, "num_redundant": -1}, "num_redundant must be >= 0"),
        ({"num_gpus": 4, "dispatch": "random"}, "dispatch must be one of"),
        ({"num_gpus": 4, "max_moves": -1}, "max_moves"),
        ({"num_gpus": 4, "min_layer_gain": -0.1}, "min_layer_gain"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(LOADS, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("loads", "message"),
    [
        (-np.ones((2, 8)), "non-negative"),
        (np.full((2, 8), np.nan), "finite"),
        (np.ones(8), r"shape \[T, L, E\] or \[L, E\]"),
        (np.ones((0, 2, 8)), "empty"),
    ],
)
def test_bad_loads(loads: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(loads, num_gpus=4)
    with pytest.raises(ValueError, match=message):
        baseline_plan(loads, num_gpus=4)


def test_current_must_fit_and_keep_every_expert() -> None:
    good = np.tile(np.arange(8), (2, 1))
    plan(LOADS, num_gpus=4, current=good)
    with pytest.raises(ValueError, match="shape"):
        plan(LOADS, num_gpus=4, current=good[:, :6])
    dropped = good.copy()
    dropped[1, 3] = 0  # expert 3 of layer 1 has no slot any more
    with pytest.raises(ValueError, match="drops logical expert 3 in layer 1"):
        plan(LOADS, num_gpus=4, current=dropped)
    with pytest.raises(ValueError, match="outside"):
        plan(LOADS, num_gpus=4, current=good + 1)
    with pytest.raises(ValueError, match="integer"):
        plan(LOADS, num_gpus=4, current=good + 0.5)
