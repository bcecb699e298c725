"""Launcher goldens: the SGLang command line for three reference deployments.

Each case in tests/runtime/golden/<name>.json holds an EngineConfig, the pod's
environment and (optionally) a persisted placement to mount; <name>.args.json holds the
expected argv. Regenerate with MOE_UPDATE_GOLDEN=1 after an intended change and review
the diff. test_launcher_sglang.py parses the same argv with SGLang's own parser.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rt_helpers import GOLDEN, run_cli

from moe_placement.maps import trivial_map

CASES = sorted(p.stem for p in GOLDEN.glob("*.json") if not p.name.endswith(".args.json"))


def render_case(name: str, tmp: Path) -> tuple[list[str], dict[str, Any]]:
    """Run `moe-runtime print-args` for a case; returns argv with tmp paths normalized."""
    case = json.loads((GOLDEN / f"{name}.json").read_text())
    placement = tmp / "placement.json"
    spec = case.get("placement")
    if spec:
        rng = np.random.default_rng(0)
        m = trivial_map(spec["layers"], spec["experts"], spec["slots"])
        m = np.stack([rng.permutation(row) for row in m])
        placement.write_text(
            json.dumps(
                {
                    "version": spec["version"],
                    "generatedAt": "2026-01-01T00:00:00Z",
                    "physicalToLogicalMap": m.tolist(),
                }
            )
        )
    engine = json.loads(json.dumps(case["engine"]).replace("$PLACEMENT", str(placement)))
    cfg = tmp / "engine.json"
    cfg.write_text(json.dumps(engine))
    state = tmp / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_", "LWS_", "POD_IP"))}
    env.update(case["env"])
    res = run_cli("print-args", "--format", "json", "--config", str(cfg), "--state-dir", str(state), env=env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    argv = [a.replace(str(state), "$STATE_DIR").replace(str(placement), "$PLACEMENT") for a in out["argv"]]
    return argv, case


def _golden_path(name: str) -> Path:
    return GOLDEN / f"{name}.args.json"


def test_three_reference_deployments_exist() -> None:
    assert len(CASES) >= 3, CASES


@pytest.mark.parametrize("name", CASES)
def test_golden_command_line(name: str, tmp_path: Path) -> None:
    argv, _ = render_case(name, tmp_path)
    path = _golden_path(name)
    if os.environ.get("MOE_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(argv, indent=1) + "\n")
    expected = json.loads(path.read_text())
    assert argv == expected


@pytest.mark.parametrize("name", CASES)
def test_init_expert_location_holds_only_the_map(name: str, tmp_path: Path) -> None:
    argv, case = render_case(name, tmp_path)
    if not case.get("placement"):
        assert "--init-expert-location" not in argv
        return
    path = argv[argv.index("--init-expert-location") + 1].replace("$STATE_DIR", str(tmp_path / "state"))
    doc = json.loads(Path(path).read_text())
    assert list(doc) == ["physical_to_logical_map"]  # SGLang passes the dict as kwargs
    spec = case["placement"]
    assert np.asarray(doc["physical_to_logical_map"]).shape == (spec["layers"], spec["slots"])


def test_mismatched_placement_is_ignored_at_boot(tmp_path: Path) -> None:
    """A persisted map that does not fit (other model or EP size) must not block the start."""
    bad = tmp_path / "placement.json"
    bad.write_text(
        json.dumps(
            {"version": 1, "generated_at": 0, "physical_to_logical_map": trivial_map(61, 256, 264).tolist()}
        )
    )
    cfg = tmp_path / "engine.json"
    cfg.write_text(
        json.dumps(
            {
                "modelPath": "m",
                "parallel": {"nnodes": 1, "gpusPerNode": 8},
                "eplb": {"numRedundantExperts": 32, "placementFile": str(bad)},
                "model": {"numLayers": 61, "numExperts": 256},
            }
        )
    )
    res = run_cli("print-args", "--format", "json", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    assert "--init-expert-location" not in json.loads(res.stdout)["argv"]
