"""Which map a starting engine boots with: the highest valid version among the mounted live
ConfigMap and the map the sidecar last accepted; on a tie the pushed one, as the plugin decides at
a rebalance (the control loop pushes each instance its own map under the version whose pool map
the live ConfigMap holds, so a restarted container whose state survived keeps its own map)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from moe_contract.engine import EngineConfig
from moe_operator.render.engine import engine_config
from moe_placement import document
from moe_placement.document import PlacementDoc
from moe_placement.maps import trivial_map
from moe_runtime import exchange
from moe_runtime.launcher.init_location import prepare
from render_cases import gb200_decode_spec


def _setup(
    tmp_path: Path, mounted_version: int, pushed_version: int
) -> tuple[EngineConfig, Path, np.ndarray]:
    cfg = EngineConfig.model_validate(engine_config(gb200_decode_spec(), "decode"))
    layers = cfg.model.num_layers
    experts = cfg.model.num_experts
    assert layers is not None and experts is not None
    slots = experts + cfg.eplb.num_redundant_experts
    pool = trivial_map(layers, experts, slots)
    own = np.roll(pool, 1, axis=1)  # another valid map: every expert keeps a slot
    mounted = tmp_path / "placement.json"
    mounted.write_text(json.dumps(document.render(mounted_version, pool, datetime.now(UTC))))
    cfg = cfg.model_copy(update={"eplb": cfg.eplb.model_copy(update={"placement_file": str(mounted)})})
    state = tmp_path / "state"
    state.mkdir()
    exchange.write_placement(exchange.placement_path(state), PlacementDoc(pushed_version, own, time.time()))
    return cfg, state, own


def test_a_tie_boots_the_pushed_map(tmp_path: Path) -> None:
    cfg, state, own = _setup(tmp_path, 5, 5)
    init = prepare(cfg, state)
    assert init.version == 5 and init.path is not None
    booted = np.asarray(json.loads(init.path.read_text())["physical_to_logical_map"])
    assert np.array_equal(booted, own), "the pool map of the live ConfigMap won a tie"


def test_a_newer_live_version_wins(tmp_path: Path) -> None:
    cfg, state, own = _setup(tmp_path, 6, 5)
    init = prepare(cfg, state)
    assert init.version == 6 and init.path is not None
    booted = np.asarray(json.loads(init.path.read_text())["physical_to_logical_map"])
    assert not np.array_equal(booted, own)
