"""The control loop's pure parts: windows, aggregation, decisions, validation, one evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from moe_operator.control.aggregate import latest, time_buckets
from moe_operator.control.decide import Inputs, decide
from moe_operator.control.evaluate import Policy, PoolShape, evaluate
from moe_operator.control.placement import document, problems, trivial_map
from moe_operator.control.publish import configmaps, expired_versions
from moe_operator.control.windows import History, Window, parse_windows
from moe_operator.render.group import Owner

L, E, R, G = 4, 16, 4, 4  # one dense layer (row 0 has no traffic)


def window(inst: str, seq: int, t: float, rng: np.random.Generator) -> Window:
    counts = np.zeros((L, E))
    counts[1:] = rng.zipf(1.6, size=(L - 1, E)).clip(max=200) * 10.0
    return Window(inst, seq, t, counts)


def test_parse_windows_drops_wrong_shapes() -> None:
    answer = {
        "windows": [{"seq": 1, "ended_at": 5, "counts": [[1, 2]]}, {"seq": 2, "ended_at": 6, "counts": [[1]]}]
    }
    got = parse_windows("a", answer, (1, 2))
    assert [w.seq for w in got] == [1]


def test_history_dedups_by_cursor_and_prunes_by_age() -> None:
    rng = np.random.default_rng(0)
    h = History()
    assert h.add([window("a", 1, 10, rng), window("a", 2, 20, rng)]) == 2
    assert h.add([window("a", 2, 20, rng), window("b", 1, 15, rng)]) == 1
    h.prune(now=30, max_age_s=16)
    assert [(w.instance, w.seq) for w in h.windows] == [("b", 1), ("a", 2)]
    h.forget_instance("a")
    assert h.add([window("a", 1, 25, rng)]) == 1  # a restarted runtime counts from 1 again


def test_buckets_sum_instances_and_latest_takes_newest_per_instance() -> None:
    rng = np.random.default_rng(1)
    ws = [window("a", 1, 10.2, rng), window("b", 1, 10.7, rng), window("a", 2, 12.5, rng)]
    hist = time_buckets(ws, bucket_s=2.0)
    assert hist.shape == (2, L, E)
    np.testing.assert_allclose(hist[0], ws[0].counts + ws[1].counts)
    total, instances, (lo, hi) = latest(ws)
    np.testing.assert_allclose(total, ws[1].counts + ws[2].counts)
    assert instances == ["a", "b"] and (lo, hi) == (10, 12)


def test_problems_catch_a_dropped_expert_and_bad_shape() -> None:
    m = trivial_map(L, E, E + R)
    assert problems(m, L, E, E + R, G) == []
    bad = m.copy()
    bad[2, :] = 0
    assert "layer 2 drops" in problems(bad, L, E, E + R, G)[0]
    assert "shape" in problems(m[:, :-1], L, E, E + R, G)[0]


@pytest.mark.parametrize(
    ("mode", "gain", "moved", "since", "reason"),
    [
        ("off", 0.5, 5, None, "off"),
        ("engine", 0.5, 5, None, "observe"),
        ("operator", 0.01, 5, None, "small_gain"),
        ("operator", 0.5, 0, None, "unchanged"),
        ("operator", 0.5, 50, None, "too_many_moves"),
        ("operator", 0.5, 5, 10.0, "min_interval"),
        ("operator", 0.5, 5, 100.0, "published"),
        ("static", 0.5, 5, None, "published"),
    ],
)
def test_decide(mode: str, gain: float, moved: int, since: float | None, reason: str) -> None:
    d = decide(Inputs(mode, 0.4, 0.4 + gain, moved, 0.03, 20, 60.0, since))  # type: ignore[arg-type]
    assert d.reason == reason
    assert d.publish == (reason == "published")
    assert d.push == (reason == "published" and mode == "operator")


def test_evaluate_beats_trivial_and_is_safe() -> None:
    rng = np.random.default_rng(2)
    ws = [window(inst, s, 10.0 * s, rng) for s in range(1, 6) for inst in ("a", "b")]
    shape = PoolShape(L, E, R, G, 1, 1, "static")
    policy = Policy("operator", 0.03, 0, 0.0, 10.0)
    ev = evaluate(ws, trivial_map(L, E, E + R), shape, policy, None, fresh_after=40.0)
    assert ev.candidate is not None and problems(ev.candidate, L, E, E + R, G) == []
    assert ev.predicted > ev.measured
    assert ev.decision.publish and ev.instances == ["a", "b"]
    with pytest.raises(ValueError, match="no fresh"):
        evaluate(ws, trivial_map(L, E, E + R), shape, policy, None, fresh_after=1000.0)


def test_configmaps_are_versioned_and_rollback_window_is_bounded() -> None:
    from datetime import UTC, datetime

    doc = document(7, trivial_map(L, E, E + R), datetime(2026, 1, 1, tzinfo=UTC))
    assert doc["generatedAt"] == "2026-01-01T00:00:00Z"
    versioned, live = configmaps(Owner("m", "ns", "u"), "decode", doc, {"instances": ["a"]})
    assert versioned["metadata"]["name"] == "m-decode-placement-v7"
    assert live["metadata"]["name"] == "m-decode-placement"
    assert live["data"] == versioned["data"]
    assert expired_versions(7) == [4] and expired_versions(2) == []
