"""The plugin against the real sglang 0.5.23 code: entry point, hook registry, rebalance_experts,
ExpertLocationMetadata.init_by_eplb. Runs in .venv-runtime (torch + sglang)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rt_helpers import require_sglang

pytestmark = pytest.mark.runtime

L, E, G, R = 4, 16, 4, 4  # layers, logical experts, GPUs (EP), redundant slots
P = E + R


@pytest.fixture(autouse=True)
def _needs_sglang() -> None:
    require_sglang()


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from sglang_ctx import plugin_hook_installed

    monkeypatch.setenv("MOE_RUNTIME_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MOE_EPLB_PLANNER", "off")
    monkeypatch.delenv("MOE_PLACEMENT_FILE", raising=False)
    with plugin_hook_installed() as original:
        yield original


def window(seed: int = 0) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 50, (8, L, E), generator=g, dtype=torch.int32)
    w[:, 0] = 0  # a dense layer: the recorder counts nothing there
    w[:, 1, 3] += 400  # a hot expert
    return w


def operator_map(seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.concatenate([np.arange(E), np.arange(R)])
    return np.stack([rng.permutation(base) for _ in range(L)]).astype(np.int64)


def put_placement(state_dir: Path, version: int, m: np.ndarray, age: float = 0.0) -> None:
    """What the sidecar writes when the operator pushes a placement."""
    from moe_runtime import exchange

    exchange.write_placement(
        exchange.placement_path(state_dir), exchange.PlacementDoc(version, m, time.time() - age)
    )


def init_by_eplb(logical_count: Any, **ctx: Any) -> Any:
    from sglang_ctx import expert_location_context

    from moe_runtime import sglang_plugin

    with expert_location_context(num_layers=L, num_experts=E, ep_size=G, num_redundant=R, **ctx) as el:
        meta = el.ExpertLocationMetadata.init_by_eplb(None, logical_count)
    sglang_plugin.hook_state().flush()  # the plugin writes its files off the engine's path
    return meta


def test_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("moe_operator_eplb") == "moe_runtime.sglang_plugin:register"


def test_sglang_load_plugins_installs_the_hook() -> None:
    """SGLang's own loader (as in every scheduler process) finds and applies the plugin."""
    code = (
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.eplb import eplb_algorithms as ea\n"
        "fn = ea.rebalance_experts\n"
        "print(fn.__wrapped__.__module__, fn.__wrapped__.__name__)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["sglang.srt.eplb.eplb_algorithms", "rebalance_experts"]


def test_without_placement_the_engine_gets_sglangs_own_answer(hook: Any, tmp_path: Path) -> None:
    import torch
    from sglang.srt.eplb.eplb_algorithms import EplbAlgorithm

    w = window()
    meta = init_by_eplb(w)
    expected = hook(w, P, P // G, None, 1, EplbAlgorithm.deepseek)
    assert torch.equal(meta.physical_to_logical_map, expected[0])
    # the window reached the sidecar's spool, summed over the buffer, with its pass count
    from moe_runtime import exchange

    (rec,) = exchange.take_windows(tmp_path)
    np.testing.assert_array_equal(rec.counts, w.sum(dim=0).numpy())
    assert rec.passes == 8 and rec.meta["num_physical"] == P and rec.meta["num_gpus"] == G
    status = json.loads((tmp_path / "plugin-status.json").read_text())
    assert status["decisions"] == {"original": 1}


def test_fresh_operator_placement_is_applied_by_init_by_eplb(hook: Any, tmp_path: Path) -> None:
    m = operator_map()
    put_placement(tmp_path, 7, m)
    meta = init_by_eplb(window())
    np.testing.assert_array_equal(meta.physical_to_logical_map.numpy(), m)
    # SGLang's derived tensors are consistent with the map
    counts = np.bincount(m[1], minlength=E)
    assert meta.logical_to_all_physical_map_num_valid[1].tolist() == counts.tolist()
    for e in range(E):
        slots = [p for p in meta.logical_to_all_physical_map[1, e].tolist() if p != -1]
        assert sorted(slots) == [p for p in range(P) if m[1, p] == e]
    from moe_runtime import exchange

    got = exchange.read_applied(tmp_path)
    assert got is not None and got[1]["source"] == "operator" and got[1]["version"] == 7
    np.testing.assert_array_equal(got[0], m)


@pytest.mark.parametrize(
    "bad",
    [
        "stale",
        "wrong_shape",
        "drops_expert",
    ],
)
def test_unusable_placement_falls_back_to_sglang(hook: Any, tmp_path: Path, bad: str) -> None:
    import torch
    from sglang.srt.eplb.eplb_algorithms import EplbAlgorithm

    m = operator_map()
    if bad == "stale":
        put_placement(tmp_path, 7, m, age=10_000)
    elif bad == "wrong_shape":
        put_placement(tmp_path, 7, np.concatenate([m, m[:, :4]], axis=1))
    else:
        m[:, m[0] == 5] = 6
        put_placement(tmp_path, 7, m)
    w = window()
    meta = init_by_eplb(w)
    expected = hook(w, P, P // G, None, 1, EplbAlgorithm.deepseek)
    assert torch.equal(meta.physical_to_logical_map, expected[0])


@pytest.mark.parametrize(
    "algorithm", ["deepseek", "deepseek_hierarchical", "deepseek_vec", "deepseek_vec_hierarchical"]
)
def test_return_contract_matches_the_original(hook: Any, tmp_path: Path, algorithm: str) -> None:
    """Same tuple, shapes, dtypes and devices as SGLang's algorithm returns."""
    from sglang.srt.eplb import eplb_algorithms as ea

    put_placement(tmp_path, 3, operator_map())
    w = window().to(dtype=__import__("torch").int32)
    args = (w, P, P // G, 4, 2, ea.EplbAlgorithm[algorithm])
    ours = ea.rebalance_experts(*args)
    theirs = hook(*args)
    assert isinstance(ours, tuple) and len(ours) == 3
    for mine, ref in zip(ours, theirs, strict=True):
        assert mine.dtype == ref.dtype and mine.device == ref.device
        assert mine.shape[:2] == ref.shape[:2]
    assert ours[1].shape[-1] >= int(ours[2].max())  # log2phy wide enough for every copy
    assert set(np.unique(ours[1].numpy())) <= set(range(-1, P))
    np.testing.assert_array_equal(ours[0].numpy(), operator_map())


def test_planner_path_through_the_real_hook(
    hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No operator placement: the project's planner (or a stand-in while it is being built) decides."""
    from moe_runtime import eplb_hook, sglang_plugin
    from moe_runtime.replay.baseline import deepseek_global

    monkeypatch.setenv("MOE_EPLB_PLANNER", "on")
    sglang_plugin.reset_state()
    state = sglang_plugin.hook_state()
    if eplb_hook.load_planner() is None:

        class Plan:
            def __init__(self, m: np.ndarray) -> None:
                self.physical_to_logical_map = m

        state.planner = lambda: (
            lambda loads, **kw: Plan(deepseek_global(loads, kw["num_gpus"], kw["num_redundant"]))
        )
    meta = init_by_eplb(window())
    assert state.last["source"] == "planner", state.last
    m = meta.physical_to_logical_map.numpy()
    assert (np.bincount(m[1], minlength=E) >= 1).all()
