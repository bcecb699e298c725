"""The static-mode load source against SGLang 0.5.23's real recorder (torch, gloo, CPU).

Two ranks run SGLang's own stat-mode recorder and dump_record() (sglang_recorder_worker.py);
the file global rank 0 writes is read with the runtime's torch-free reader and must hold the
all-reduced logical counts; the replay engine's stand-in file is read back by torch.load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rt_helpers import free_port, require_sglang

from moe_runtime import recorder

pytestmark = pytest.mark.runtime

HERE = Path(__file__).parent
L, E, R, WORLD, BUFFER = 3, 8, 4, 2, 6


@pytest.fixture(autouse=True)
def _needs_sglang() -> None:
    require_sglang()


def test_the_real_recorders_dump_reads_back_as_the_window_of_both_ranks(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    phy2log = np.stack([rng.permutation(np.concatenate([np.arange(E), rng.choice(E, R)])) for _ in range(L)])
    expected = np.zeros((BUFFER, L, E), dtype=np.int64)
    passes: list[list[list[list[int]]]] = []
    for _ in range(WORLD):
        mine = []
        for p in range(4):  # 4 of the 6 buffer rows get traffic
            per_layer: list[list[int]] = [[]]  # layer 0 is dense: no select_experts call
            for layer in range(1, L):
                topk = rng.integers(0, E + R, size=(5, 2))  # physical ids of 5 tokens, top-2
                per_layer.append(topk.tolist())
                np.add.at(expected[p, layer], phy2log[layer, topk.ravel()], 1)
            mine.append(per_layer)
        passes.append(mine)
    plan = {"layers": L, "experts": E, "phy2log": phy2log.tolist(), "buffer": BUFFER, "passes": passes}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "recorder"
    env = {**os.environ, recorder.DIR_ENV: str(out), "PYTHONPATH": os.pathsep.join(sys.path)}
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "sglang_recorder_worker.py"),
                str(r),
                str(WORLD),
                port,
                str(tmp_path / "plan.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]

    files = recorder.take_dumps(out)
    assert len(files) == 1, files  # global rank 0 alone writes it
    assert files[0].name.startswith(recorder.PREFIX) and files[0].suffix == ".pt"
    dump = recorder.read_dump(files[0])
    assert dump.rank == 0 and dump.average_utilization is None
    assert dump.logical_count.shape == (BUFFER, L, E) and dump.logical_count.dtype == np.int32
    np.testing.assert_array_equal(dump.logical_count, expected)  # both ranks, summed
    counts, n = recorder.window(dump)
    np.testing.assert_array_equal(counts, expected.sum(axis=0))
    assert n == 4 and counts[0].sum() == 0


def test_the_plugin_samples_passes_from_the_real_ring_oldest_first(tmp_path: Path) -> None:
    """SGLang's ring wraps (10 passes into 6 rows; rows are not in time order then) and its reset
    keeps the write index: the plugin, called by the real init_by_eplb on the real recorder's
    object dump, must still export the newest passes oldest first, idle ones left out."""
    rng = np.random.default_rng(8)
    phy2log = np.stack([rng.permutation(np.concatenate([np.arange(E), rng.choice(E, R)])) for _ in range(L)])
    passes, expected = [], []
    for p in range(10):
        per_layer: list[list[list[int]]] = [[] for _ in range(L)]
        logical = np.zeros((L, E), dtype=np.int64)
        if p != 7:  # pass 7 routes nothing (an idle pass)
            for layer in range(1, L):
                topk = rng.integers(0, E + R, size=(p + 1, 2))  # pass p routes p + 1 tokens
                per_layer[layer] = topk.tolist()
                np.add.at(logical[layer], phy2log[layer, topk.ravel()], 1)
        passes.append(per_layer)
        expected.append(logical)
    plan = {
        "layers": L, "experts": E, "phy2log": phy2log.tolist(), "buffer": BUFFER, "passes": [passes],
        "eplb": True,
    }  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MOE_RUNTIME_STATE_DIR": str(tmp_path / "state"),
        "MOE_EPLB_PLANNER": "off", "MOE_EPLB_MODE": "operator",
    }  # fmt: skip
    env.pop("MOE_PLACEMENT_FILE", None)
    worker = [sys.executable, str(HERE / "sglang_recorder_worker.py"), "0", "1", str(free_port())]
    run = subprocess.run(
        [*worker, str(tmp_path / "plan.json")], env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    from moe_runtime import exchange

    (window,) = exchange.take_windows(tmp_path / "state")
    newest = [4, 5, 6, 8, 9]  # the ring holds passes 4-9; pass 7 was idle
    np.testing.assert_array_equal(window.counts, np.sum([expected[p] for p in newest], axis=0))
    assert window.passes == 5 and window.steps is not None
    np.testing.assert_array_equal(window.steps, [expected[p] for p in newest])
    status = json.loads(exchange.plugin_status_path(tmp_path / "state").read_text())
    assert status["windows"] == {"present": 1}  # what moe_runtime_plugin_windows_total re-exports


def test_the_replay_engines_dump_is_what_torch_load_reads(tmp_path: Path) -> None:
    import torch

    counts = np.random.default_rng(1).integers(0, 1000, size=(5, L, E)).astype(np.int32)
    path = tmp_path / recorder.dump_name()
    recorder.write_dump(path, counts)
    loaded = torch.load(path, weights_only=True, map_location="cpu")
    assert set(loaded) == {"rank", "logical_count", "average_utilization_rate_over_window"}
    assert loaded["rank"] == 0 and loaded["average_utilization_rate_over_window"] is None
    assert loaded["logical_count"].dtype == torch.int32
    np.testing.assert_array_equal(loaded["logical_count"].numpy(), counts)
    # and a non-contiguous tensor torch.save writes (strides) reads back too
    torch.save({**loaded, "logical_count": loaded["logical_count"].transpose(1, 2)}, tmp_path / "t.pt")
    np.testing.assert_array_equal(
        recorder.read_dump(tmp_path / "t.pt").logical_count, counts.transpose(0, 2, 1)
    )


def test_a_pickle_that_is_not_a_recorder_dump_is_refused(tmp_path: Path) -> None:
    """The reader unpickles with a closed set of globals: a torch.save of anything else fails cleanly."""
    import torch

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    torch.save({"logical_count": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(recorder.DumpError, match="references"):
        recorder.read_dump(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()
    torch.save({"rank": 0, "logical_count": torch.zeros(3, 3)}, tmp_path / "float.pt")
    with pytest.raises(recorder.DumpError, match="integer"):
        recorder.read_dump(tmp_path / "float.pt")
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(recorder.DumpError):
        recorder.read_dump(tmp_path / "junk.pt")
