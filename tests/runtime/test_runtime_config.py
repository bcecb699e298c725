"""EngineConfig and pod environment: the operator <-> runtime contract and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rt_helpers import run_cli

from moe_contract.engine import EngineConfig
from moe_runtime.config import ConfigError, PodEnv, parse_config, pod_problems


def base(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "modelPath": "deepseek-ai/DeepSeek-V3",
        "role": "decode",
        "parallel": {"nnodes": 2, "gpusPerNode": 8, "attnDp": 16},
        "eplb": {"numRedundantExperts": 32},
        "model": {"numLayers": 61, "numExperts": 256, "topK": 8},
    }
    doc.update(over)
    return doc


def test_defaults_are_derived() -> None:
    cfg = parse_config(base())
    assert cfg.parallel.tp_size == 16
    assert cfg.parallel.ep_size == 16
    assert cfg.deepep_mode == "low_latency"
    assert cfg.dispatch == "static"
    assert cfg.eplb_enabled
    assert parse_config(base(role="prefill")).deepep_mode == "normal"


def test_snake_case_keys_are_accepted_too() -> None:
    cfg = EngineConfig.model_validate({"model_path": "m", "parallel": {"gpus_per_node": 4}})
    assert cfg.parallel.gpus_per_node == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parallel": {"nnodes": 2, "gpusPerNode": 8, "tp": 8}}, "must equal nnodes*gpusPerNode"),
        ({"parallel": {"nnodes": 2, "gpusPerNode": 8, "attnDp": 3}}, "attnDp=3 must divide"),
        ({"parallel": {"nnodes": 2, "gpusPerNode": 8, "ep": 8}}, "must equal tp=16"),
        ({"parallel": {"nnodes": 1, "gpusPerNode": 1}}, "DeepEP intranode"),
        ({"eplb": {"numRedundantExperts": 30}}, "must be a multiple of ep=16"),
        (
            {"parallel": {"nnodes": 1, "gpusPerNode": 8, "a2aBackend": "none", "ep": 1}},
            "needs expert parallelism",
        ),
        (
            {"role": "prefill", "parallel": {"nnodes": 2, "gpusPerNode": 8, "deepepMode": "low_latency"}},
            "prefill",
        ),
        ({"extraArgs": ["--tp-size", "4"]}, "--tp-size"),
        ({"extraArgs": ["--enable-eplb"]}, "--enable-eplb"),
        ({"unknownField": 1}, "Extra inputs are not permitted"),
        ({"role": "router"}, "role"),
    ],
)
def test_impossible_configs_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        parse_config(base(**change))


def test_pod_env_reads_moe_and_lws_variables() -> None:
    pod = PodEnv.from_env(
        {"LWS_WORKER_INDEX": "3", "LWS_GROUP_SIZE": "4", "LWS_LEADER_ADDRESS": "g-0.g", "POD_IP": "10.0.0.5"}
    )
    assert (pod.rank, pod.nnodes, pod.leader_address, pod.pod_ip) == (3, 4, "g-0.g", "10.0.0.5")
    pod = PodEnv.from_env({"MOE_RANK": "1", "LWS_WORKER_INDEX": "3", "MOE_INSTANCE": "ds-decode-0"})
    assert (pod.rank, pod.instance) == (1, "ds-decode-0")
    with pytest.raises(ConfigError, match="MOE_RANK"):
        PodEnv.from_env({"MOE_RANK": "x"})


def test_pod_problems() -> None:
    cfg = parse_config(base())
    assert pod_problems(cfg, PodEnv(rank=1, leader_address="l")) == []
    problems = " ".join(pod_problems(cfg, PodEnv(rank=2, nnodes=3, role="prefill")))
    for text in ("MOE_RANK=2", "MOE_NNODES=3", "MOE_LEADER_ADDRESS", "MOE_ROLE=prefill"):
        assert text in problems


def test_impossible_config_exits_nonzero_with_a_message(tmp_path: Path) -> None:
    bad = tmp_path / "engine.json"
    bad.write_text(json.dumps(base(eplb={"numRedundantExperts": 30})))
    for command in ("print-args", "launch"):
        res = run_cli(
            command,
            "--config",
            str(bad),
            "--state-dir",
            str(tmp_path / "s"),
            env={"MOE_RANK": "0", "MOE_LEADER_ADDRESS": "x"},
        )
        assert res.returncode == 2, res
        assert "refusing to start" in res.stderr
        assert "numRedundantExperts" in res.stderr


def test_bad_pod_env_exits_nonzero(tmp_path: Path) -> None:
    cfg = tmp_path / "engine.json"
    cfg.write_text(json.dumps(base()))
    res = run_cli("print-args", "--config", str(cfg), env={"MOE_RANK": "5"})
    assert res.returncode == 2
    assert "MOE_RANK=5 is out of range" in res.stderr
    assert "MOE_LEADER_ADDRESS is required" in res.stderr


def test_missing_config_file_exits_nonzero(tmp_path: Path) -> None:
    res = run_cli("print-args", "--config", str(tmp_path / "nope.json"))
    assert res.returncode == 2
    assert "cannot read engine config" in res.stderr
