"""The plugin's decision logic (numpy core, no torch): which map, from where, and safety."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moe_placement.maps import trivial_map
from moe_runtime import eplb_hook, exchange
from moe_runtime.replay.baseline import deepseek_global

SHAPE = eplb_hook.EngineShape(num_layers=3, num_logical=8, num_physical=12, num_gpus=4, num_nodes=1)


def counts() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 100, size=(3, 8)).astype(np.int64)


def good_map(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(row) for row in trivial_map(3, 8, 12)])


def state(tmp: Path, **kw: Any) -> eplb_hook.HookState:
    settings = eplb_hook.HookSettings(**{"state_dir": tmp, "use_planner": False, **kw})
    return eplb_hook.HookState(settings)


def write_placement(path: Path, version: int, m: np.ndarray, age: float = 0.0) -> None:
    """The sidecar's binary file (.npz) or an operator ConfigMap (JSON), by suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = exchange.PlacementDoc(version, m, time.time() - age)
    if path.suffix == ".npz":
        exchange.write_placement(path, doc)
    else:
        path.write_text(json.dumps(doc.to_json()))


def test_no_placement_and_no_planner_means_original(tmp_path: Path) -> None:
    d = eplb_hook.choose_map(state(tmp_path), counts(), SHAPE)
    assert (d.source, d.phy2log) == ("original", None)


def test_fresh_operator_placement_wins(tmp_path: Path) -> None:
    m = good_map()
    write_placement(exchange.placement_path(tmp_path), 5, m)
    d = eplb_hook.choose_map(state(tmp_path), counts(), SHAPE)
    assert d.source == "operator" and d.version == 5
    np.testing.assert_array_equal(d.phy2log, m)


def test_highest_version_across_sidecar_and_mounted_file(tmp_path: Path) -> None:
    mounted = tmp_path / "cm" / "placement.json"
    write_placement(exchange.placement_path(tmp_path), 5, good_map(1))
    write_placement(mounted, 9, good_map(2))
    d = eplb_hook.choose_map(state(tmp_path, placement_file=mounted), counts(), SHAPE)
    assert d.version == 9
    np.testing.assert_array_equal(d.phy2log, good_map(2))


@pytest.mark.parametrize(
    "bad",
    [
        trivial_map(3, 8, 16),  # wrong slot count
        trivial_map(2, 8, 12),  # wrong layer count
        np.zeros((3, 12), dtype=np.int64),  # drops experts
    ],
)
def test_unfit_placement_falls_back_and_counts_an_error(tmp_path: Path, bad: np.ndarray) -> None:
    write_placement(exchange.placement_path(tmp_path), 5, bad)
    st = state(tmp_path)
    d = eplb_hook.choose_map(st, counts(), SHAPE)
    assert d.source == "original"
    assert st.errors["placement"] == 1


def test_stale_placement_is_not_used(tmp_path: Path) -> None:
    write_placement(exchange.placement_path(tmp_path), 5, good_map(), age=100)
    d = eplb_hook.choose_map(state(tmp_path, max_age_s=50), counts(), SHAPE)
    assert d.source == "original" and "stale" in d.reason


def test_engine_mode_leaves_the_decision_to_sglang(tmp_path: Path) -> None:
    write_placement(exchange.placement_path(tmp_path), 5, good_map())
    d = eplb_hook.choose_map(state(tmp_path, mode="engine"), counts(), SHAPE)
    assert d.source == "original"


class FakePlan:
    def __init__(self, m: np.ndarray) -> None:
        self.physical_to_logical_map = m
        self.predicted_balancedness = np.ones(m.shape[0])


def test_planner_is_used_without_operator_placement(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def plan(loads: np.ndarray, **kw: Any) -> FakePlan:
        calls.append(kw)
        return FakePlan(deepseek_global(loads, kw["num_gpus"], kw["num_redundant"]))

    st = state(tmp_path, use_planner=True)
    st.planner = lambda: plan
    d = eplb_hook.choose_map(st, counts(), SHAPE, current=trivial_map(3, 8, 12))
    assert d.source == "planner"
    assert calls[0]["num_gpus"] == 4 and calls[0]["num_redundant"] == 4 and calls[0]["current"] is not None


def test_planner_map_that_drops_an_expert_is_refused(tmp_path: Path) -> None:
    st = state(tmp_path, use_planner=True)
    st.planner = lambda: lambda loads, **kw: FakePlan(np.zeros((3, 12), dtype=np.int64))
    d = eplb_hook.choose_map(st, counts(), SHAPE)
    assert d.source == "original"
    assert st.errors["planner"] == 1


def test_planner_exception_falls_back(tmp_path: Path) -> None:
    def boom(loads: np.ndarray, **kw: Any) -> FakePlan:
        raise RuntimeError("planner bug")

    st = state(tmp_path, use_planner=True)
    st.planner = lambda: boom
    assert eplb_hook.choose_map(st, counts(), SHAPE).source == "original"
    assert st.errors["planner"] == 1


def test_real_project_planner_if_present(tmp_path: Path) -> None:
    """The lazy import of moe_placement.plan; its map must pass the same validation."""
    if eplb_hook.load_planner() is None:
        pytest.skip("moe_placement.plan not importable yet")
    st = eplb_hook.HookState(eplb_hook.HookSettings(state_dir=tmp_path))
    d = eplb_hook.choose_map(st, counts(), SHAPE)
    assert d.source == "planner", (d.reason, dict(st.errors))


def test_single_process_path_spools_and_records(tmp_path: Path) -> None:
    st = state(tmp_path)
    c = counts()
    decision, _ = eplb_hook.rebalance_single_process(st, c, 17, SHAPE, lambda: trivial_map(3, 8, 12))
    st.flush()  # files are written off the engine's path
    assert decision.source == "original"
    windows = exchange.take_windows(tmp_path)
    assert len(windows) == 1 and windows[0].passes == 17
    np.testing.assert_array_equal(windows[0].counts, c)
    got = exchange.read_applied(tmp_path)
    assert got is not None and got[1]["source"] == "original"
    np.testing.assert_array_equal(got[0], trivial_map(3, 8, 12))
    status = json.loads(exchange.plugin_status_path(tmp_path).read_text())
    assert status["decisions"] == {"original": 1}


def test_window_from_buffer_counts_passes_with_traffic() -> None:
    buf = np.zeros((5, 3, 8), dtype=np.int32)
    buf[0, 1, 2] = 4
    buf[3, 2, 1] = 6
    total, passes = eplb_hook.window_from_buffer(buf)
    assert passes == 2 and total.sum() == 10 and total.dtype == np.int64


def test_step_samples_read_the_ring_from_its_write_index_and_skip_idle_passes() -> None:
    """SGLang's ring writes row ``next_index`` next: rows from there on are the oldest."""
    routed = np.array([True, True, False, True, True, True])  # row 2 idle
    np.testing.assert_array_equal(eplb_hook.sample_positions(routed, 4), [4, 5, 0, 1, 3])
    np.testing.assert_array_equal(eplb_hook.sample_positions(routed, 0), [0, 1, 3, 4, 5])
    assert eplb_hook.sample_positions(routed, None) is None  # order unknown: no samples
    assert eplb_hook.sample_positions(routed, 6) is None
    assert eplb_hook.sample_positions(np.zeros(4, dtype=bool), 0) is None
    assert (
        eplb_hook.sample_positions(routed, True) is None and eplb_hook.sample_positions(routed, 0, 0) is None
    )
    np.testing.assert_array_equal(eplb_hook.sample_positions(routed, 4, count=1), [3])  # the newest
    assert eplb_hook.steps_from_buffer(np.zeros((0, 3, 8), dtype=np.int32), 0) is None
    many = eplb_hook.sample_positions(np.ones(1000, dtype=bool), 700, count=32)
    assert many is not None and many.size == 32 and many[0] == 700 and many[-1] == 699  # oldest, newest
    unrolled = (many - 700) % 1000
    assert (np.diff(unrolled) > 0).all() and np.diff(unrolled).max() - np.diff(unrolled).min() <= 1


def test_steps_from_a_wrapped_buffer_come_out_oldest_first(tmp_path: Path) -> None:
    buf = np.zeros((5, 3, 8), dtype=np.int32)
    for t, row in enumerate([3, 4, 0, 1]):  # 4 passes written from row 3 on: next write at row 2
        buf[row, 1, t] = t + 1
    steps = eplb_hook.steps_from_buffer(buf, 2)
    assert steps is not None and steps.dtype == np.int32
    np.testing.assert_array_equal(steps[:, 1].argmax(axis=1), [0, 1, 2, 3])
    st = state(tmp_path)
    eplb_hook.rebalance_single_process(
        st, buf.sum(axis=0), 4, SHAPE, lambda: trivial_map(3, 8, 12), steps=steps
    )
    st.flush()
    (w,) = exchange.take_windows(tmp_path)
    assert w.steps is not None and w.steps.dtype == np.int32
    np.testing.assert_array_equal(w.steps, steps)


def test_a_spooled_window_whose_samples_do_not_fit_keeps_its_counts(tmp_path: Path) -> None:
    c = counts()
    exchange.write_window(
        tmp_path, exchange.WindowRecord(c, 3, 0.0, 1.0, steps=np.ones((2, 3, 7), dtype=np.int32))
    )
    (w,) = exchange.take_windows(tmp_path)
    assert w.steps is None
    np.testing.assert_array_equal(w.counts, c)


def test_export_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    st = state(blocker)  # state dir is a file: every write fails
    eplb_hook.export_window(st, counts(), 1, SHAPE)
    st.flush()
    assert st.errors["export"] == 1


def test_background_writer_is_bounded_and_ordered() -> None:
    import threading

    writer = eplb_hook.BackgroundWriter(limit=2)
    gate = threading.Event()
    seen: list[int] = []
    writer.submit(gate.wait)  # blocks the thread
    for i in range(5):
        writer.submit(lambda i=i: seen.append(i))
    assert writer.dropped >= 2
    gate.set()
    writer.flush()
    assert seen == sorted(seen) and seen[0] == 0


def test_spool_is_bounded(tmp_path: Path) -> None:
    for _ in range(exchange.SPOOL_LIMIT + 5):
        exchange.write_window(tmp_path, exchange.WindowRecord(counts(), 1, 0.0, 1.0))
    assert len(list(exchange.spool_dir(tmp_path).glob("window-*.npz"))) == exchange.SPOOL_LIMIT


def test_settings_from_env(tmp_path: Path) -> None:
    s = eplb_hook.HookSettings.from_env(
        {
            "MOE_EPLB_MODE": "engine",
            "MOE_RUNTIME_STATE_DIR": str(tmp_path),
            "MOE_PLACEMENT_FILE": "/etc/moe/placement/placement.json",
            "MOE_PLACEMENT_MAX_AGE_SECONDS": "60",
            "MOE_EP_DISPATCH": "dynamic",
            "MOE_EPLB_PLANNER": "off",
        }
    )
    assert (s.mode, s.state_dir, s.max_age_s, s.dispatch, s.use_planner) == (
        "engine",
        tmp_path,
        60.0,
        "dynamic",
        False,
    )


def test_exported_windows_are_counted_by_their_step_samples(tmp_path: Path) -> None:
    """A window that routed tokens but went out without samples is what the sidecar's
    moe_runtime_plugin_windows_total{step_samples="missing"} (and MoEStepSamplesMissing) counts."""
    st = state(tmp_path)
    steps = np.ones((2, 3, 8), dtype=np.int32)
    eplb_hook.export_window(st, counts(), 5, SHAPE, steps)
    eplb_hook.export_window(st, counts(), 5, SHAPE, None)  # ring order unreadable
    eplb_hook.export_window(st, np.zeros((3, 8), dtype=np.int64), 0, SHAPE, None)  # no traffic
    eplb_hook.export_window(st, counts(), 5, SHAPE, steps[:0])  # no row taken
    st.flush()
    assert eplb_hook.status_doc(st)["windows"] == {"present": 1, "missing": 2, "idle": 1}


def test_window_with_steps_reads_the_buffer_as_the_two_calls_do() -> None:
    rng = np.random.default_rng(7)
    buf = rng.integers(0, 4, size=(9, 3, 8)).astype(np.int32)
    buf[[2, 5]] = 0  # idle passes
    total, passes, steps = eplb_hook.window_with_steps(buf, 4)
    assert passes == eplb_hook.window_from_buffer(buf)[1] == 7
    np.testing.assert_array_equal(total, buf.sum(axis=0))
    expected = eplb_hook.steps_from_buffer(buf, 4)
    assert steps is not None and expected is not None
    np.testing.assert_array_equal(steps, expected)
    np.testing.assert_array_equal(steps, buf[[4, 6, 7, 8, 0, 1, 3]])  # the ring from row 4, idle rows out
    empty = eplb_hook.window_with_steps(np.zeros((0, 3, 8), dtype=np.int32), 0)
    assert empty[1] == 0 and empty[2] is None
