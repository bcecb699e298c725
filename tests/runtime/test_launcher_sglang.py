"""The launcher's command lines, parsed by SGLang 0.5.23's own argument parser.

SGLang builds its parser with ``ServerArgs.add_cli_args`` (argument definitions in
sglang/srt/arg_groups/fields/*.py); ``prepare_server_args`` does the same. A flag that does
not exist, a value outside its choices or a malformed value makes argparse exit.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

import pytest
from rt_helpers import require_sglang
from test_launcher_golden import CASES, render_case

from moe_contract import engine as config

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    require_sglang()
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(p)
    return p


def option_strings(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


@pytest.mark.parametrize("name", CASES)
def test_golden_argv_parses_with_sglang(parser: argparse.ArgumentParser, name: str, tmp_path: Path) -> None:
    argv, case = render_case(name, tmp_path)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    ns = parser.parse_args(argv[3:])
    engine, env = case["engine"], case["env"]
    par = engine["parallel"]
    world = par["nnodes"] * par["gpusPerNode"]
    assert ns.tp_size == world
    assert ns.ep_size == world
    assert ns.attn_dp_size == par.get("attnDp", 1)
    assert ns.moe_a2a_backend == "deepep"
    assert (
        ns.deepep_mode == {"prefill": "normal", "decode": "low_latency", "standalone": "auto"}[engine["role"]]
    )
    eplb = engine["eplb"]
    if eplb["mode"] in ("operator", "engine"):
        assert ns.enable_eplb is True  # SGLang rebalances, the plugin's hook decides
        assert ns.expert_distribution_recorder_mode is None  # SGLang sets stat itself with EPLB
    else:  # static: no rebalance ever; the recorder for the sidecar's dumps
        assert ns.enable_eplb is False
        assert ns.expert_distribution_recorder_mode == "stat"
        # no buffer size given: SGLang sizes the circular buffer from the rebalance iterations
        # (arg_groups/parallel_hook.py, handle_expert_distribution_metrics)
        assert ns.expert_distribution_recorder_buffer_size is None
    assert ns.ep_num_redundant_experts == eplb["numRedundantExperts"]
    assert ns.eplb_rebalance_num_iterations == eplb["rebalanceIterations"]
    assert ns.enable_metrics is True
    assert ns.expert_balancedness_report_mode == "prometheus"
    assert ns.model_path == engine["modelPath"]
    assert ns.port == 30000
    if par["nnodes"] > 1:
        assert ns.nnodes == par["nnodes"]
        assert ns.node_rank == int(env["MOE_RANK"])
        assert ns.dist_init_addr == f"{env['MOE_LEADER_ADDRESS']}:20102"
    mode = engine["role"] if engine["role"] != "standalone" else "null"
    assert ns.disaggregation_mode == mode
    if mode == "prefill":
        assert ns.disaggregation_bootstrap_port == 8998
    if case.get("placement"):
        assert ns.init_expert_location.endswith("init-expert-location.json")
    else:
        assert ns.init_expert_location == "trivial"


def test_managed_flags_exist_in_sglang(parser: argparse.ArgumentParser) -> None:
    """extraArgs refusals name real flags (and stay in step with SGLang's renames)."""
    known = option_strings(parser)
    missing = sorted(f for f in config.MANAGED_FLAGS if f not in known)
    assert not missing, missing


def _choices(parser: argparse.ArgumentParser, flag: str) -> set[Any]:
    action = option_strings(parser)[flag]
    assert action.choices is not None, flag
    return set(action.choices)


@pytest.mark.parametrize(
    ("literal", "flag"),
    [
        (config.A2ABackend, "--moe-a2a-backend"),
        (config.DeepEPMode, "--deepep-mode"),
        (config.DispatchAlgorithm, "--ep-dispatch-algorithm"),
        (config.TransferBackend, "--disaggregation-transfer-backend"),
    ],
)
def test_config_choices_are_sglang_choices(parser: argparse.ArgumentParser, literal: Any, flag: str) -> None:
    assert set(typing.get_args(literal)) <= _choices(parser, flag)


def test_role_modes_are_sglang_choices(parser: argparse.ArgumentParser) -> None:
    assert {"prefill", "decode"} <= _choices(parser, "--disaggregation-mode")
    assert "prometheus" in _choices(parser, "--expert-balancedness-report-mode")


def test_a_typo_in_extra_args_would_be_caught(parser: argparse.ArgumentParser) -> None:
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parser.parse_args(["--model-path", "m", "--deepep-mode", "fast"])
