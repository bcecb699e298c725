"""The control loop's pure parts: windows, aggregation, decisions, validation, one evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from moe_operator.api import keys as K
from moe_operator.control.aggregate import latest, time_buckets
from moe_operator.control.decide import Inputs, decide
from moe_operator.control.evaluate import Policy, PoolShape, evaluate
from moe_operator.control.publish import configmaps, expired_versions
from moe_operator.control.windows import History, Window, parse_windows
from moe_operator.render.group import Owner
from moe_placement.document import render as document
from moe_placement.maps import map_problems, trivial_map

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
    assert map_problems(m, num_layers=L, num_logical=E, num_physical=E + R, num_gpus=G) == []
    bad = m.copy()
    bad[2, :] = 0
    assert (
        "of layer 2 has no slot"
        in map_problems(bad, num_layers=L, num_logical=E, num_physical=E + R, num_gpus=G)[0]
    )
    assert "slots per layer" in map_problems(m[:, :-1], num_layers=L, num_logical=E, num_physical=E + R)[0]


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
    assert ev.candidate is not None and shape.problems(ev.candidate) == []
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


def test_history_snapshot_round_trips_within_quantisation() -> None:
    from moe_operator.control import history_store as hs

    rng = np.random.default_rng(3)
    ws = [window(inst, s, 10.0 * s, rng) for s in range(1, 7) for inst in ("a", "b")]
    snap = hs.snapshot(ws, 10.0, {"a": 6, "b": 6}, now=65.0)
    assert snap is not None and snap.keys == [1, 2, 3, 4, 5, 6]
    back = hs.decode(hs.encode(snap), (L, E))
    assert back is not None and back.keys == snap.keys and back.cursors == {"a": 6, "b": 6}
    peak = snap.counts.max(axis=-1, keepdims=True)
    assert np.all(np.abs(back.counts - snap.counts) <= peak / 65535 + 1e-9)
    assert hs.decode(hs.encode(snap), (L, E + 1)) is None  # another model: ignored, not misread
    assert hs.decode("{not json", (L, E)) is None


def test_history_snapshot_is_bounded_by_dropping_the_oldest_buckets() -> None:
    from moe_operator.control import history_store as hs

    rng = np.random.default_rng(4)
    counts = rng.integers(0, 60000, size=(40, 61, 256)).astype(np.float64)  # DeepSeek-V3, incompressible
    snap = hs.Snapshot(5.0, list(range(100, 140)), counts, {}, 0.0)
    text = hs.encode(snap, max_bytes=200_000)
    back = hs.decode(text, (61, 256))
    assert len(text) <= 200_000 and back is not None
    assert 0 < len(back.keys) < 40 and back.keys == list(range(140 - len(back.keys), 140))  # newest kept
    assert len(hs.encode(snap)) <= hs.MAX_BYTES < 1024 * 1024
    with pytest.raises(ValueError, match="one bucket"):
        hs.encode(snap, max_bytes=1000)


def test_restored_history_plans_like_the_lost_one_but_does_not_score() -> None:
    """After a restart the planner sees the same buckets as before; only live windows are scored."""
    from moe_operator.control import aggregate
    from moe_operator.control import history_store as hs

    rng = np.random.default_rng(5)
    old = [window(inst, s, 10.0 * s, rng) for s in range(1, 6) for inst in ("a", "b")]
    snap = hs.decode(hs.encode(hs.snapshot(old, 10.0, {"a": 5, "b": 5}, 55.0)), (L, E))  # type: ignore[arg-type]
    assert snap is not None
    restarted = History()
    restarted.restore(hs.restored_windows(snap), snap.cursors)
    assert restarted.add([window("a", 5, 50.0, rng)]) == 0  # already counted before the restart
    new = [window("a", 6, 60.0, rng), window("b", 6, 61.0, rng)]
    assert restarted.add(new) == 2
    keys, hist = aggregate.bucketed(list(restarted.windows), 10.0)
    want_keys, want = aggregate.bucketed([*old, *new], 10.0)
    assert keys == want_keys
    np.testing.assert_allclose(hist, want, atol=want.max() / 65535 * 2)

    shape = PoolShape(L, E, R, G, 1, 1, "static")
    policy = Policy("operator", 0.03, 0, 0.0, 10.0)
    ev = evaluate(list(restarted.windows), trivial_map(L, E, E + R), shape, policy, None, fresh_after=0.0)
    assert (ev.history_buckets, ev.restored_buckets) == (6, 5)
    assert ev.instances == ["a", "b"] and ev.window_range == (60, 61)  # restored buckets never vote
    only_restored = History()
    only_restored.restore(hs.restored_windows(snap), {})
    with pytest.raises(ValueError, match="no fresh"):
        evaluate(list(only_restored.windows), trivial_map(L, E, E + R), shape, policy, None, 0.0)


def _published(version: int, seed: int) -> list[dict]:  # type: ignore[type-arg]
    from datetime import UTC, datetime

    m = trivial_map(L, E, E + R)
    m[1:] = np.random.default_rng(seed).permuted(m[1:], axis=1)
    doc = document(version, m, datetime(2026, 1, 1, 0, version, tzinfo=UTC))
    return configmaps(Owner("m", "ns", "u"), "decode", doc, {"predictedBalancedness": 0.9, "movedExperts": 3})


def test_rollback_publishes_an_old_map_as_a_new_paused_version() -> None:
    import json
    from datetime import UTC, datetime

    from moe_operator.control import rollback as rb

    v3, v4, v5 = _published(3, 3), _published(4, 4), _published(5, 5)
    listing = [v3[0], v4[0], v5[0], v5[1]]  # kept copies and the live map (v5)
    entries = rb.history(listing, "m", "decode")
    assert [(e.version, e.live) for e in entries] == [(3, False), (4, False), (5, True)]
    assert rb.pick(entries, None).version == 4  # default: the one before the live map
    assert rb.pick(entries, 3).version == 3
    with pytest.raises(ValueError, match="not kept"):
        rb.pick(entries, 1)
    with pytest.raises(ValueError, match="already the live"):
        rb.pick(entries, 5)

    objs, expired = rb.rollback(
        Owner("m", "ns", "u"), "decode", entries, entries[0], datetime(2026, 1, 2, tzinfo=UTC)
    )
    copy, live = objs
    assert (
        copy["metadata"]["name"] == "m-decode-placement-v6"
        and live["metadata"]["name"] == "m-decode-placement"
    )
    doc = json.loads(live["data"]["placement.json"])
    assert doc["version"] == 6 and doc["physicalToLogicalMap"] == entries[0].phy2log.tolist()
    provenance = json.loads(live["metadata"]["annotations"]["moe.inference.dev/placement-provenance"])
    assert provenance["reason"] == "rollback of v3" and provenance["movedExperts"] > 0
    assert live["metadata"]["annotations"][K.PLACEMENT_PAUSED] == "rollback of v3 to v6"
    assert K.PLACEMENT_PAUSED not in copy["metadata"]["annotations"]  # the kept copy is history, not a switch
    assert expired == [3]  # the window of kept versions slides: v4, v5, v6
    assert "rollback of v3" in rb.describe(rb.history([copy, live], "m", "decode")[0])
    unpaused, _ = rb.rollback(
        Owner("m", "ns", "u"), "decode", entries, entries[1], datetime.now(UTC), pause=False
    )
    assert K.PLACEMENT_PAUSED not in unpaused[1]["metadata"]["annotations"]


def test_paused_placement_is_measured_but_not_replaced() -> None:
    d = decide(Inputs("operator", 0.5, 0.9, 10, 0.03, 0, 0.0, None, paused="rollback of v3 to v6"))
    assert (d.publish, d.reason) == (False, "paused") and "rollback of v3" in d.message
    assert decide(Inputs("off", 0.5, 0.9, 10, 0.03, 0, 0.0, None, paused="x")).reason == "off"


def test_parse_windows_refuses_hostile_answers() -> None:
    ok = {"seq": 1, "ended_at": 100.0, "counts": [[1, 2]]}
    hostile = [
        {"seq": 2, "ended_at": 100.0 + 3600, "counts": [[1, 2]]},  # an hour in the future
        {"seq": 3, "ended_at": float("nan"), "counts": [[1, 2]]},
        {"seq": -1, "ended_at": 100.0, "counts": [[1, 2]]},
        {"seq": 2**60, "ended_at": 100.0, "counts": [[1, 2]]},
        {"seq": "7", "ended_at": 100.0, "counts": [[1, 2]]},
        {"seq": 4, "ended_at": 100.0, "counts": [[1, float("inf")]]},
        {"seq": 5, "ended_at": 100.0, "counts": [["a", 2]]},
        {"seq": 6, "ended_at": 100.0, "counts": [[1, -2]]},
        "not a window",
    ]
    got = parse_windows("a", {"windows": [ok, *hostile]}, (1, 2), now=100.0)
    assert [w.seq for w in got] == [1]
    assert parse_windows("a", {"windows": "x"}, (1, 2), now=100.0) == []


def test_history_stays_within_its_byte_bound_dropping_the_oldest() -> None:
    rng = np.random.default_rng(1)
    one = window("a", 1, 1.0, rng).counts.nbytes
    h = History(max_bytes=3 * one, per_instance=one)
    h.add([window("a", s, float(s), rng) for s in range(1, 6)])
    assert [w.seq for w in h.windows] == [3, 4, 5]


def test_history_keeps_each_instance_of_a_large_pool_and_counts_step_samples() -> None:
    """A pool-wide bound alone would leave each of hundreds of instances a window or two."""
    rng = np.random.default_rng(2)
    one = window("a", 1, 1.0, rng).counts.nbytes
    h = History(max_bytes=3 * one, per_instance=2 * one)
    for s in range(1, 4):
        h.add([window(f"i{k}", s, float(s), rng) for k in range(10)])
    assert len(h.windows) == 20 and {w.seq for w in h.windows} == {2, 3}  # two each, the oldest gone
    counts = h.windows[-1].counts
    steps = np.stack([np.floor(counts / 2)] * 2)
    h.add([Window("i0", 4, 4.0, counts, steps=steps)])  # samples the size of two windows' counts
    assert sum(w.counts.nbytes + (0 if w.steps is None else w.steps.nbytes) for w in h.windows) <= 20 * one


def test_read_stored_adopts_only_valid_bounded_documents() -> None:
    import json as _json
    import time as _time
    from datetime import UTC, datetime

    from moe_operator.control.live import read_stored

    shape = PoolShape(
        num_layers=L, num_experts=E, num_redundant=R, num_gpus=G, num_nodes=1, num_groups=1, dispatch="static"
    )
    now = _time.time()
    good = document(3, trivial_map(L, E, E + R), datetime.fromtimestamp(now - 60, UTC))

    def cm(doc: object, paused: str = "") -> dict:  # type: ignore[type-arg]
        meta = {"annotations": {K.PLACEMENT_PAUSED: paused}} if paused else {}
        return {
            "metadata": meta,
            "data": {"placement.json": doc if isinstance(doc, str) else _json.dumps(doc)},
        }

    ok = read_stored(cm(good, paused="rollback"), shape, now)
    assert ok.version == 3 and ok.phy2log is not None and ok.paused == "rollback"
    dropped = trivial_map(L, E, E + R)
    dropped[1, :] = 0
    hostile = [
        {**good, "physicalToLogicalMap": dropped.tolist()},  # drops experts
        {**good, "version": 10**12},  # locks every later version out
        {**good, "generatedAt": "2099-01-01T00:00:00Z"},  # defeats the staleness check
        {**good, "physicalToLogicalMap": [[0] * (E + R)]},  # wrong shape
        "{not json",
        "[" * 100_000 + "]" * 100_000,  # deep
    ]
    for doc in hostile:
        got = read_stored(cm(doc), shape, now)
        assert got.phy2log is None and got.problems, doc if isinstance(doc, dict) else doc[:20]


def test_step_samples_are_kept_when_they_are_samples_of_their_window() -> None:
    counts = [[5, 7], [0, 4]]
    steps = [[[1, 2], [0, 1]], [[2, 3], [0, 3]]]
    (w,) = parse_windows(
        "a", {"windows": [{"seq": 1, "ended_at": 9.0, "counts": counts, "steps": steps}]}, (2, 2)
    )
    assert w.steps is not None and w.steps.dtype == np.uint16 and w.steps.shape == (2, 2, 2)
    np.testing.assert_array_equal(w.steps, steps)


def test_step_samples_are_stored_exactly_in_the_narrowest_type() -> None:
    def stored(value: float) -> np.ndarray | None:
        answer = {
            "windows": [{"seq": 1, "ended_at": 9.0, "counts": [[2**40, 2**40]], "steps": [[[value, 1]]]}]
        }
        (w,) = parse_windows("a", answer, (1, 2), now=10.0)
        return w.steps

    for value, dtype in ((65535, np.uint16), (65536, np.uint32), (16777219, np.uint32), (2**32, np.float32),
                         (0.5, np.float32)):  # fmt: skip
        got = stored(value)
        assert got is not None and got.dtype == dtype, value
        assert got[0, 0, 0] == np.float32(value) if dtype == np.float32 else got[0, 0, 0] == value


def test_hostile_step_samples_are_dropped_and_their_window_still_counts() -> None:
    counts = [[5, 7]]
    hostile: list[object] = [
        [[[1, 2]]] * 65,  # more samples than the runtime ever sends
        [[[1, 2, 3]]],  # another shape
        [[[1]], [[1, 2]]],  # ragged
        [[[float("nan"), 1]]],  # json.loads takes NaN
        [[[1, float("inf")]]],
        [[[-1, 2]]],
        [[[4, 4]], [[2, 4]]],  # more than the window routed to expert 0 (6 > 5)
        [],
        "steps",
        {"0": [[1, 2]]},
        [[["a", 2]]],
        [[[10**400, 1]]],  # an integer no float holds (json.loads gives a Python int)
        [[[1e38, 1]], [[1e38, 1]], [[1e38, 1]], [[1e38, 1]]],  # finite, but not once stored as float32
    ]
    for bad in hostile:
        answer = {"windows": [{"seq": 1, "ended_at": 9.0, "counts": counts, "steps": bad}]}
        (w,) = parse_windows("a", answer, (1, 2), now=10.0)
        assert w.seq == 1 and w.steps is None, bad


def test_numbers_too_large_for_a_float_drop_the_window_instead_of_raising() -> None:
    huge = 10**400
    answer = {
        "windows": [
            {"seq": 1, "ended_at": 9.0, "counts": [[huge, 1]]},
            {"seq": 2, "ended_at": huge, "counts": [[1, 1]]},
            {"seq": 3, "ended_at": -huge, "counts": [[1, 1]]},
            {"seq": 4, "ended_at": 9.0, "counts": [[1, 1]]},
        ]
    }
    assert [w.seq for w in parse_windows("a", answer, (1, 2), now=10.0)] == [4]
    for value in (4e38, 16777219.5):  # past float32; rounds up to 16777220 in float32 (> its window)
        (w,) = parse_windows("a", {"windows": [{**answer["windows"][3], "counts": [[value, 1]],
                                                "steps": [[[value, 1]]]}]}, (1, 2), now=10.0)  # fmt: skip
        assert w.steps is None, value
    (w,) = parse_windows("a", {"windows": [{**answer["windows"][3], "steps": [[[1, 1]]]}]}, (1, 2), now=10.0)
    assert w.steps is not None


def test_step_samples_stay_with_their_own_window() -> None:
    """Two entries with one number: each window's samples are checked against its own counts."""
    answer = {
        "windows": [
            {"seq": 5, "ended_at": 9.0, "counts": [[9, 9]], "steps": [[[9, 9]]]},
            {"seq": 5, "ended_at": 5.0, "counts": [[5, 5]], "steps": [[[2, 2]]]},
        ]
    }
    got = parse_windows("a", answer, (1, 2), now=10.0)
    assert got[0].steps is not None and got[0].steps.tolist() == [[[9, 9]]] and got[1].steps is None


def test_step_samples_are_read_from_the_newest_window_of_an_answer_only() -> None:
    one = {"counts": [[5, 7]], "steps": [[[1, 2]]]}
    answer = {"windows": [{"seq": 2, "ended_at": 9.0, **one}, {"seq": 1, "ended_at": 8.0, **one}]}
    got = {w.seq: w.steps is not None for w in parse_windows("a", answer, (1, 2), now=10.0)}
    assert got == {2: True, 1: False}


def test_history_keeps_step_samples_on_each_instances_newest_window_only() -> None:
    rng = np.random.default_rng(3)
    h = History()

    def sampled(inst: str, seq: int, t: float) -> Window:
        w = window(inst, seq, t, rng)
        return Window(inst, seq, t, w.counts, steps=np.stack([w.counts / 4] * 3).astype(np.float32))

    h.add([sampled("a", 1, 10), sampled("b", 1, 11)])
    h.add([sampled("a", 2, 20), window("b", 2, 21, rng)])  # b's newest window came without samples
    held = {(w.instance, w.seq): w.steps is not None for w in h.windows}
    assert held == {("a", 1): False, ("b", 1): True, ("a", 2): True, ("b", 2): False}
    h.add([sampled("b/new-uid", 1, 30)])  # b's leader restarted: its old samples go
    assert [(w.instance, w.seq) for w in h.windows if w.steps is not None] == [("a", 2), ("b/new-uid", 1)]


def test_one_runtimes_flood_of_windows_cannot_push_the_other_instances_out() -> None:
    """The hostile probe's case: 3 instances x 9 windows, then one answer of 1024 windows from a
    fourth. Each instance past its share loses its own oldest first; an answer keeps its newest 64."""
    rng = np.random.default_rng(4)
    one = window("a", 1, 1.0, rng).counts.nbytes
    h = History(max_bytes=40 * one, per_instance=12 * one)
    for s in range(1, 10):
        h.add([window(f"honest-{k}/u", s, float(s), rng) for k in range(3)])
    flood = {"windows": [{"seq": s, "ended_at": 100.0 + s / 100, "counts": window("x", s, 0.0, rng).counts.tolist()}
                         for s in range(1, 1025)]}  # fmt: skip
    got = parse_windows("hostile-0/u", flood, (L, E), now=200.0)
    assert [w.seq for w in got] == list(range(961, 1025))  # the newest 64
    h.add(got)
    per = {
        k: sum(w.instance.startswith(k) for w in h.windows)
        for k in ("honest-0", "honest-1", "honest-2", "hostile")
    }
    assert per["honest-0"] == per["honest-1"] == per["honest-2"] == 9
    assert (
        per["hostile"] == max(40, 4 * 12) - 27 and h.windows[-1].seq == 1024
    )  # the rest of the bound: its newest
