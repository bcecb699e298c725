"""`moe-operator eplb plan|bench` through the real top-level parser."""

import json
from pathlib import Path

import numpy as np
import pytest

from moe_operator.cli import main


def test_plan_writes_only_the_map_sglang_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"logical_count": [[[600, 560, 120, 120, 20, 10, 10, 10]]]}))
    out = tmp_path / "out.json"
    args = [
        "eplb",
        "plan",
        "--load",
        str(load),
        "--num-gpus",
        "8",
        "--redundant",
        "8",
        "--dispatch",
        "dynamic",
    ]
    assert main([*args, "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert list(data) == ["physical_to_logical_map"]
    phy2log = np.array(data["physical_to_logical_map"])
    assert phy2log.shape == (1, 16) and set(phy2log[0]) == set(range(8))
    assert "predicted balancedness (dynamic)" in capsys.readouterr().err

    # the output is a valid --current; a [L][E] load is accepted too
    load.write_text(json.dumps({"logical_count": [[600, 560, 120, 120, 20, 10, 10, 10]]}))
    again = tmp_path / "again.json"
    assert main([*args, "--current", str(out), "--max-moves", "0", "-o", str(again)]) == 0
    assert json.loads(again.read_text()) == data


def test_plan_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"logical_count": [[1, 2, 3, 4]]}))
    out = tmp_path / "out.json"
    assert main(["eplb", "plan", "--load", str(load), "--num-gpus", "3", "-o", str(out)]) == 2
    assert "do not divide over 3 GPUs" in capsys.readouterr().err
    load.write_text(json.dumps({"counts": []}))
    assert main(["eplb", "plan", "--load", str(load), "--num-gpus", "2", "-o", str(out)]) == 2
    assert '"logical_count"' in capsys.readouterr().err
    assert not out.exists()


def test_bench_prints_side_by_side_tables(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "eplb",
        "bench",
        "--suite",
        "synthetic,real,cluster",
        "--seeds",
        "1",
        "--setups",
        "EP8",
        "--regimes",
        "fast",
        "--real-setups",
        "R8",
        "--modes",
        "prefill",
        "--schedules",
        "walk",
        "--cluster",
        "real:R8:prefill-walk",
        "--replicas",
        "2",
        "--affinity",
        "0",
        "--windows",
        "1",
        "--layers",
        "2",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    for part in ("EP8", "fast", "prefill-walk", "oracle", "captured", "per instance", "geometric mean"):
        assert part in text


def test_bench_reports_bad_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eplb", "bench", "--regimes", "calm"]) == 2
    assert "--regimes: unknown ['calm']" in capsys.readouterr().err
    assert main(["eplb", "bench", "--seeds", "x"]) == 2
    assert "--seeds must be" in capsys.readouterr().err
