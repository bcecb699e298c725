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


def _route_auth_levels() -> dict[str, str]:
    """Route path -> AuthLevel name of every endpoint SGLang 0.5.23's HTTP server marks, read
    from sglang/srt/entrypoints/http_server.py itself (importing it needs the GPU build's deps)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("sglang.srt.entrypoints.http_server")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    levels: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        paths, level = [], None
        for deco in node.decorator_list:
            if not isinstance(deco, ast.Call):
                continue
            func = deco.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "app"
            ):
                if (
                    deco.args
                    and isinstance(deco.args[0], ast.Constant)
                    and isinstance(deco.args[0].value, str)
                ):
                    paths.append(deco.args[0].value)
            elif isinstance(func, ast.Name) and func.id == "auth_level" and deco.args:
                arg = deco.args[0]
                if isinstance(arg, ast.Attribute):
                    level = arg.attr
        for path in paths:
            levels[path] = level or "NORMAL"
    return levels


def test_the_admin_key_locks_sglangs_admin_endpoints_and_nothing_the_pod_needs(tmp_path: Path) -> None:
    """With the launcher's --admin-api-key (and no --api-key), SGLang 0.5.23's own auth decision
    refuses its admin endpoints to a peer without the key, lets the key through, and leaves
    requests, probes and /metrics open; the recorder endpoints the sidecar calls in static mode
    are among the locked ones (so the sidecar must send the key: tests/runtime/test_runtime_launch.py)."""
    require_sglang()
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    from moe_runtime import recorder
    from moe_runtime.launcher.args import lock_admin

    levels = _route_auth_levels()
    admin = {p for p, lv in levels.items() if lv != "NORMAL"}
    for path in ("/update_weights_from_disk", "/send_weights_to_remote_instance", "/load_lora_adapter",
                 "/release_memory_occupation", "/pause_generation", "/flush_cache", "/start_profile",
                 recorder.START_PATH, recorder.DUMP_PATH):  # fmt: skip
        assert path in admin, (path, levels.get(path))
    for path in ("/generate", "/v1/chat/completions", "/v1/completions", "/model_info", "/server_info"):
        assert levels.get(path) == "NORMAL", (path, levels.get(path))

    key = "k" * 64
    argv, _ = render_case(CASES[0], tmp_path)
    locked = lock_admin(argv, key)
    assert locked[: len(argv)] == argv
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    from sglang.srt.server_args import ServerArgs

    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(locked[3:])
    assert ns.admin_api_key == key and ns.api_key is None

    def allowed(path: str, header: str | None) -> bool:
        level = AuthLevel[levels.get(path, "NORMAL")]
        decision = decide_request_auth(
            method="POST", path=path, authorization_header=header, api_key=ns.api_key,
            admin_api_key=ns.admin_api_key, auth_level=level,
        )  # fmt: skip
        return decision.allowed

    for path in sorted(p for p in admin if levels[p] == "ADMIN_OPTIONAL"):
        assert not allowed(path, None), path
        assert not allowed(path, "Bearer wrong"), path
        assert allowed(path, f"Bearer {key}"), path
    for path in ("/generate", "/v1/chat/completions", "/health", "/health_generate", "/ready", "/metrics"):
        assert allowed(path, None), path
