"""The operator reads a binary /v1/windows answer (moe_contract.windows_wire) into the same windows
as its JSON twin: the same counts and step samples, and the same windows dropped for the same
reasons (parse_windows judges both)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from moe_contract import windows_wire as ww
from moe_contract.windows_wire import WireWindow
from moe_operator.control.windows import Window, parse_windows

SHAPE = (58, 256)  # DeepSeek-V3's MoE layers x routed experts
NOW = 1000.0


def json_twin(windows: list[WireWindow], latest_seq: int) -> dict[str, Any]:
    """What the runtime's JSON answer holds of the same windows (moe_runtime ... Window.to_json),
    through the wire: json.dumps then json.loads."""
    docs = []
    for w in windows:
        doc: dict[str, Any] = {"seq": w.seq, "started_at": w.started_at, "ended_at": w.ended_at,
                               "passes": w.passes, "counts": np.asarray(w.counts).tolist()}  # fmt: skip
        if w.steps is not None:
            doc["steps"] = np.asarray(w.steps).tolist()
        docs.append(doc)
    answer: dict[str, Any] = json.loads(json.dumps({"windows": docs, "latest_seq": latest_seq, "now": NOW}))
    return answer


def both(windows: list[WireWindow], shape: tuple[int, int] = SHAPE) -> tuple[list[Window], list[Window]]:
    latest = max((w.seq for w in windows if isinstance(w.seq, int)), default=0)
    from_json = parse_windows("a", json_twin(windows, latest), shape, now=NOW)
    from_binary = parse_windows("a", ww.decode(ww.encode(windows, latest, NOW)), shape, now=NOW)
    return from_json, from_binary


def assert_same(got: list[Window], want: list[Window]) -> None:
    assert [(w.instance, w.seq, w.ended_at, w.restored) for w in got] == [
        (w.instance, w.seq, w.ended_at, w.restored) for w in want
    ]
    for g, w in zip(got, want, strict=True):
        assert g.counts.dtype == w.counts.dtype == np.float64
        np.testing.assert_array_equal(g.counts, w.counts)
        assert (g.steps is None) == (w.steps is None)
        if g.steps is not None and w.steps is not None:
            assert g.steps.dtype == w.steps.dtype
            np.testing.assert_array_equal(g.steps, w.steps)


def v3_windows(n: int, rng: np.random.Generator) -> list[WireWindow]:
    """n windows at V3 shape, the newest with 32 step samples; sums past float32's exact integers."""
    steps = rng.integers(0, 3000, (32, *SHAPE))
    out = []
    for i in range(n):
        counts = rng.integers(2**24, 2**26, SHAPE)
        counts[0, 0] = 2**33 + 1  # past uint32 too
        newest = i == n - 1
        out.append(WireWindow(100 + i, NOW - 60 * (n - i), NOW - 60 * (n - i - 1) - 1, 7000, counts,
                              steps if newest else None))  # fmt: skip
    return out


@pytest.mark.parametrize("n", [1, 8])
def test_binary_and_json_answers_give_the_same_windows(n: int) -> None:
    from_json, from_binary = both(v3_windows(n, np.random.default_rng(n)))
    assert len(from_binary) == n and from_binary[-1].steps is not None
    assert_same(from_binary, from_json)


def test_kept_arrays_do_not_hold_the_answers_body() -> None:
    """A history of views would keep every answer's whole body alive (64 MiB each)."""
    rng = np.random.default_rng(3)
    windows = [
        WireWindow(1, 1.0, 2.0, 1, rng.random((2, 3)), rng.random((1, 2, 3)) / 10)
    ]  # float64 on the wire
    (w,) = parse_windows("a", ww.decode(ww.encode(windows, 1, NOW)), (2, 3), now=NOW)
    assert w.counts.flags.owndata and w.counts.flags.writeable
    assert w.steps is not None and w.steps.flags.owndata


def test_hostile_values_are_dropped_exactly_as_in_json() -> None:
    ok = np.array([[5, 7]])
    f = np.array([[5.0, 7.0]])
    hostile = [
        WireWindow(1, 0.0, 100.0, 1, ok, np.array([[[1, 2]]])),
        WireWindow(2, 0.0, 100.0 + 3600, 1, ok),  # an hour in the future
        WireWindow(3, 0.0, float("nan"), 1, ok),
        WireWindow(-1, 0.0, 100.0, 1, ok),
        WireWindow(2**60, 0.0, 100.0, 1, ok),
        WireWindow("7", 0.0, 100.0, 1, ok),  # type: ignore[arg-type]
        WireWindow(True, 0.0, 100.0, 1, ok),
        WireWindow(None, 0.0, 100.0, 1, ok),  # type: ignore[arg-type]
        WireWindow(4, 0.0, 100.0, 1, np.array([[1.0, float("inf")]])),
        WireWindow(5, 0.0, 100.0, 1, np.array([[float("nan"), 1.0]])),
        WireWindow(6, 0.0, 100.0, 1, np.array([[1, -2]])),
        WireWindow(7, 0.0, 100.0, 1, np.array([[1, 2, 3]])),  # another shape
        WireWindow(8, 0.0, 100.0, 1, np.array([[1], [2]])),
        WireWindow(9, 0.0, None, 1, ok),  # type: ignore[arg-type]
        WireWindow(10, 0.0, "9", 1, ok),  # type: ignore[arg-type]
        WireWindow(11, 0.0, 1e300, 1, ok),
        WireWindow(1, 0.0, 99.0, 1, ok),  # a duplicate number: both kept, as from JSON (History dedups)
        WireWindow(12, 0.0, 100.0, 1, f, np.array([[[float("nan"), 1.0]]])),  # steps dropped, window kept
        WireWindow(13, 0.0, 100.0, 1, f, np.array([[[-1.0, 1.0]]])),
        WireWindow(14, 0.0, 100.0, 1, f, np.array([[[4, 4]], [[2, 4]]])),  # more than the window routed
        WireWindow(15, 0.0, 100.0, 1, f, np.ones((33, 1, 2))),  # more samples than the runtime sends
        WireWindow(16, 0.0, 100.0, 1, np.array([[4e38, 1.0]]), np.array([[[4e38, 1.0]]])),  # float32: inf
    ]
    for w in hostile:  # each on its own: steps are read from an answer's newest window only
        from_json, from_binary = both([w], shape=(1, 2))
        assert_same(from_binary, from_json)
    from_json, from_binary = both(hostile, shape=(1, 2))
    assert_same(from_binary, from_json)
    assert [w.seq for w in from_binary] == [1, 9, 1, 12, 13, 14, 15, 16]  # 9: no end reads as 0.0, as in JSON


def test_a_pool_of_another_shape_keeps_nothing() -> None:
    from_json, from_binary = both(v3_windows(2, np.random.default_rng(5)), shape=(61, 256))
    assert from_json == from_binary == []
