"""Every example, rendered by `moe-operator render`, starts the real programs' parsers cleanly.

For each example and each group backend: every engine ConfigMap's engine.json goes through
`moe-runtime print-args` once per rank, with the environment the rendered pod template gives
that rank (fieldRefs resolved as the kubelet would), and the command is parsed by SGLang 0.5.23's
own parser (as ``prepare_server_args`` builds it). The router Deployment's command is parsed by
sglang-router 0.3.2's own ``parse_router_args``; the real router binary is then started with it
(only its listen ports moved to loopback) to show the probes' endpoints behave as the probes
assume: /liveness 200, /readiness 503 while no worker is healthy.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rt_helpers import REPO, free_port, require_sglang, wait_for

from moe_operator.api import MoEDeploymentSpec
from moe_operator.recipe import startup_timeout_s
from moe_operator.render.shared import ROUTER_LAUNCH

pytestmark = pytest.mark.runtime

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BACKENDS = ["StatefulSet", "LeaderWorkerSet"]


class Refused(Exception):
    pass


@pytest.fixture(scope="module")
def engine_parser() -> argparse.ArgumentParser:
    require_sglang()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)

    def error(self: argparse.ArgumentParser, message: str) -> Any:
        raise Refused(message)

    parser.error = types.MethodType(error, parser)  # type: ignore[method-assign]
    return parser


@functools.cache
def _rendered(example: Path, backend: str) -> str:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "moe_operator.cli",
            "render",
            "-f",
            str(example),
            "--group-backend",
            backend,
            "--policy",
            str(example.parents[1] / "policies" / "platform" / "examples.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def render(example: Path, backend: str) -> list[dict[str, Any]]:
    """`moe-operator render` (the CLI, once per example and backend) as objects."""
    return [d for d in yaml.safe_load_all(_rendered(example, backend)) if d]


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], int]]:
    """(group name, pod template, pods in the group) for every engine group."""
    out = []
    for obj in objects:
        if obj["kind"] == "StatefulSet":
            out.append((obj["metadata"]["name"], obj["spec"]["template"], obj["spec"]["replicas"]))
        elif obj["kind"] == "LeaderWorkerSet":
            tmpl = obj["spec"]["leaderWorkerTemplate"]
            out.append((obj["metadata"]["name"], tmpl["workerTemplate"], tmpl["size"]))
    return out


def pod_env(template: dict[str, Any], group: str, rank: int) -> dict[str, str]:
    """The engine container's environment in pod ``rank`` of ``group``, as the kubelet resolves it."""
    (engine,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
    fields = {
        "metadata.labels['apps.kubernetes.io/pod-index']": str(rank),
        "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']": str(rank),
        "status.podIP": f"10.1.0.{rank + 1}",
        "metadata.name": f"{group}-{rank}",
    }
    env: dict[str, str] = {}
    for item in engine.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"unresolvable env {item}"
            env[item["name"]] = fields[path]
    return env


def engine_config(objects: list[dict[str, Any]], template: dict[str, Any]) -> dict[str, Any]:
    names = [v["configMap"]["name"] for v in template["spec"]["volumes"] if v["name"] == "engine-config"]
    (config,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == names[0]]
    return dict(json.loads(config["data"]["engine.json"]))


def print_args(config: dict[str, Any], env: dict[str, str], tmp: Path) -> list[str]:
    """`moe-runtime print-args` in this process (its main(), with the pod's environment)."""
    from moe_runtime.cli import main

    tmp.mkdir(parents=True)
    path = tmp / "engine.json"
    path.write_text(json.dumps(config))
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        for name in [k for k in os.environ if k.startswith(("MOE_", "LWS_", "POD_"))]:
            mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        code = main(
            ["print-args", "--format", "json", "--config", str(path), "--state-dir", str(tmp / "state")]
        )
    assert code == 0, out.getvalue()
    argv: list[str] = json.loads(out.getvalue())["argv"]
    return argv


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rank_command_parses_with_sglang(
    engine_parser: argparse.ArgumentParser, example: Path, backend: str, tmp_path: Path
) -> None:
    objects = render(example, backend)
    spec = yaml.safe_load(example.read_text())["spec"]
    groups = pod_templates(objects)
    assert groups, "no engine groups rendered"
    for group, template, size in groups:
        config = engine_config(objects, template)
        pool = template["metadata"]["labels"]["moe.inference.dev/pool"]
        extra = [*spec.get("engine", {}).get("extraArgs", []), *spec[pool].get("extraArgs", [])]
        for rank in range(size):
            argv = print_args(config, pod_env(template, group, rank), tmp_path / f"{group}-{rank}")
            assert argv[1:3] == ["-m", "sglang.launch_server"]
            try:
                ns = engine_parser.parse_args(argv[3:])
            except Refused as exc:
                raise AssertionError(
                    f"{example.name} {group} rank {rank}: SGLang refuses {argv}: {exc}"
                ) from exc
            par = config["parallel"]
            assert ns.tp_size == par["nnodes"] * par["gpusPerNode"]
            assert ns.nnodes == par["nnodes"] == size
            assert ns.node_rank == rank
            assert ns.model_path == config["modelPath"]
            assert ns.trust_remote_code == ("--trust-remote-code" in extra)
            for arg in extra:
                if arg.startswith("--") and arg not in ("--trust-remote-code",):
                    assert arg.split("=", 1)[0] in argv, (arg, argv)
            if "--cuda-graph-max-bs-decode" in extra:
                assert ns.cuda_graph_max_bs_decode == int(
                    extra[extra.index("--cuda-graph-max-bs-decode") + 1]
                )


def router_command(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    command: list[str] = router["command"]
    assert command[:3] == ["python3", "-c", ROUTER_LAUNCH]  # execs sglang_router.launch_router, locked
    assert router["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert router["livenessProbe"]["httpGet"]["path"] == "/liveness"
    return command


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_router_command_parses_with_the_router(example: Path) -> None:
    require_sglang()
    from sglang_router.launch_router import parse_router_args

    objects = render(example, "StatefulSet")
    command = router_command(objects)
    args = parse_router_args(command[3:])
    assert args.control_plane_api_keys == []  # the launcher adds the lock, nothing else sets keys
    spec = yaml.safe_load(example.read_text())["spec"]
    assert args.port == spec.get("router", {}).get("port", 8000)
    policy = spec.get("router", {}).get("policy", "cache_aware")
    assert args.policy == policy
    # spec.engine.startupTimeout, or the recipe's default for the model and sizes
    assert args.worker_startup_timeout_secs == startup_timeout_s(MoEDeploymentSpec.model_validate(spec))
    assert args.prometheus_port == 29000
    decode = spec["decode"]["replicas"]
    if spec.get("prefill"):
        assert args.pd_disaggregation
        # prefill by the spec's policy, decode by load: P/D decode keeps no prefix cache
        # (power_of_two needs two workers to choose from: the router refuses it over one)
        decode_policy = "power_of_two" if decode >= 2 else "round_robin"
        assert (args.prefill_policy, args.decode_policy) == (policy, decode_policy)
        assert len(args.prefill_urls) == spec["prefill"]["replicas"]
        assert all(port == 8998 for _, port in args.prefill_urls)
        assert len(args.decode_urls) == decode
    else:
        assert len(args.worker_urls) == decode


def test_router_version_check_passes_with_the_pinned_router() -> None:
    require_sglang()
    objects = render(EXAMPLES[0], "StatefulSet")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (check,) = deployment["spec"]["template"]["spec"]["initContainers"]
    command = [sys.executable if c == "python3" else c for c in check["command"]]
    assert subprocess.run(command, capture_output=True, text=True, timeout=60).returncode == 0
    command[-1] = "0.0.1"
    res = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "spec.router.image" in res.stderr


@pytest.mark.parametrize("name", ["qwen3-30b", "qwen3-235b"])  # one worker; P/D with one decode instance
def test_real_router_serves_what_the_probes_expect(tmp_path: Path, name: str) -> None:
    """The rendered router command runs (listen ports moved to loopback): /liveness 200 at once,
    /readiness 503 while no worker is healthy, where /health (the old probe) already says 200.
    Its control plane is locked: a client cannot register a worker of its own (it would get other
    users' prompts), list the workers, or flush their caches."""
    require_sglang()
    example = next(p for p in EXAMPLES if name in p.name)
    argv = router_command(render(example, "StatefulSet"))[1:]
    port, metrics = free_port(), free_port()
    moved = {"--host": "127.0.0.1", "--port": str(port), "--prometheus-port": str(metrics)}
    argv = [moved.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    log = (tmp_path / "router.log").open("w")
    proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.get(f"{base}/liveness", timeout=2).status_code == 200, 60, what="router /liveness"
        )
        assert httpx.get(f"{base}/readiness", timeout=2).status_code == 503
        assert httpx.get(f"{base}/health", timeout=2).status_code == 200
        intruder = {"url": f"http://127.0.0.1:{free_port()}"}
        assert httpx.post(f"{base}/workers", json=intruder, timeout=5).status_code == 401
        assert httpx.get(f"{base}/workers", timeout=5).status_code == 401
        assert httpx.post(f"{base}/flush_cache", timeout=5).status_code == 401
        forged = {"Authorization": "Bearer moe-operator"}
        assert httpx.post(f"{base}/workers", json=intruder, headers=forged, timeout=5).status_code == 401
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
