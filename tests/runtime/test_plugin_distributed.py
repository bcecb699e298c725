"""Multi-process plugin test on gloo: ranks see different placement files and still agree.

Four processes form a torch.distributed group (like the 4 EP ranks of an engine), each
with its own state dir. SGLang's real init_by_eplb runs on every rank with the plugin
hooked in; rank 0 decides and broadcasts, so all ranks must end with rank 0's choice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rt_helpers import free_port, require_sglang

pytestmark = pytest.mark.runtime

WORKER = Path(__file__).parent / "sglang_dist_worker.py"
SHAPE = {"layers": 3, "experts": 8, "gpus": 4, "redundant": 4}


def a_map(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    base = np.concatenate([np.arange(8), np.arange(4)])
    return np.stack([rng.permutation(base) for _ in range(3)]).tolist()


def test_ranks_agree_on_rank0s_choice(tmp_path: Path) -> None:
    require_sglang()
    maps = {k: a_map(k) for k in (1, 2, 3)}
    plan = {
        "state_root": str(tmp_path / "state"),
        "shape": SHAPE,
        "scenarios": {
            # rank 0 holds the operator's v5; rank 1 a newer v9 nobody pushed to rank 0
            "rank0_has_operator_map": {
                "window_seed": 1,
                "0": {"version": 5, "map": maps[1]},
                "1": {"version": 9, "map": maps[2]},
                "3": {"version": 5, "map": maps[3], "age": 10_000},
            },
            # rank 0 has nothing: SGLang's own algorithm on every rank, even where others hold maps
            "rank0_has_none": {
                "window_seed": 2,
                "1": {"version": 9, "map": maps[2]},
                "2": {"version": 4, "map": maps[3]},
            },
            # rank 0's map is stale: same as none
            "rank0_stale": {
                "window_seed": 3,
                "0": {"version": 5, "map": maps[1], "age": 10_000},
                "1": {"version": 9, "map": maps[2]},
            },
        },
    }
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    port = free_port()
    world = 4
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(r),
                str(world),
                str(port),
                str(plan_file),
                str(tmp_path / f"out{r}.json"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        logs.append(out)
    assert all(p.returncode == 0 for p in procs), "\n---\n".join(logs)
    results = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(world)]

    for name in plan["scenarios"]:
        maps_seen = [np.asarray(res[name]["phy2log"]) for res in results]
        for r in range(1, world):
            np.testing.assert_array_equal(maps_seen[r], maps_seen[0], err_msg=f"{name}: rank {r} differs")
            assert results[r][name]["log2phy"] == results[0][name]["log2phy"]
        for res in results:  # every rank's static dispatch table only points at copies of the right expert
            m = np.asarray(res[name]["phy2log"])
            table = np.asarray(res[name]["dispatch_row"])
            assert (np.take_along_axis(m, table, axis=1) == np.arange(8)).all()

    np.testing.assert_array_equal(results[0]["rank0_has_operator_map"]["phy2log"], maps[1])
    for name in ("rank0_has_none", "rank0_stale"):
        np.testing.assert_array_equal(results[0][name]["phy2log"], results[0][name]["vanilla"])
    status = json.loads((tmp_path / "state" / "rank0" / "plugin-status.json").read_text())
    assert status["decisions"] == {"operator": 1, "original": 2}
    # only rank 0 exports windows and writes status
    assert not (tmp_path / "state" / "rank1" / "plugin-status.json").exists()
    assert not list((tmp_path / "state" / "rank1").glob("spool/*"))
