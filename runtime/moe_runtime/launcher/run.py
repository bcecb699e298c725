"""``moe-runtime launch``: validate, prepare the initial placement, start sidecar + SGLang, supervise."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moe_contract import pod as P
from moe_contract.engine import EngineConfig
from moe_runtime import exchange, recorder
from moe_runtime.config import DEFAULT_TOKEN_FILE, ConfigError, PodEnv, load_config, pod_problems
from moe_runtime.launcher import init_location
from moe_runtime.launcher.args import build_command, engine_env
from moe_runtime.launcher.startup import StartTracker
from moe_runtime.launcher.supervisor import Supervisor
from moe_runtime.sidecar.service import EngineCheck, RecorderSource, Sidecar, SidecarOptions
from moe_runtime.sidecar.state import EngineLayout

log = logging.getLogger("moe_runtime.launcher")


@dataclass(frozen=True)
class LaunchPlan:
    cfg: EngineConfig
    pod: PodEnv
    state_dir: Path
    argv: list[str]
    env: dict[str, str]
    init: init_location.InitLocation


def plan_launch(
    config_path: str | None = None,
    *,
    environ: dict[str, str] | None = None,
    state_dir: str | None = None,
    python: str | None = None,
    write_init: bool = True,
) -> LaunchPlan:
    """Everything ``launch`` will do, decided up front; raises ConfigError on impossible input."""
    env = dict(os.environ if environ is None else environ)
    cfg = load_config(config_path, env)
    pod = PodEnv.from_env(env)
    problems = pod_problems(cfg, pod)
    if problems:
        raise ConfigError("invalid pod environment:\n" + "\n".join(f"  {p}" for p in problems))
    base = exchange.state_dir(state_dir or env.get(exchange.STATE_DIR_ENV))
    if write_init:
        base.mkdir(parents=True, exist_ok=True)
        init = init_location.prepare(cfg, base)
    else:
        init = init_location.InitLocation(None, None, "trivial")
    argv = build_command(
        cfg,
        pod,
        init_expert_location=str(init.path) if init.path else None,
        python=python or sys.executable,
    )
    return LaunchPlan(cfg, pod, base, argv, engine_env(cfg, pod, base, env), init)


def sidecar_options(plan: LaunchPlan, env: dict[str, str] | None = None) -> SidecarOptions:
    env = dict(os.environ if env is None else env)
    cfg, pod = plan.cfg, plan.pod
    token = env.get("MOE_RUNTIME_TOKEN_FILE", DEFAULT_TOKEN_FILE)
    engine = f"http://127.0.0.1:{cfg.ports.http}"
    return SidecarOptions(
        host=env.get("MOE_SIDECAR_HOST", "0.0.0.0"),
        port=cfg.ports.sidecar,
        probe_port=_port(env, P.ENV_PROBE_PORT, P.PROBE_PORT),
        metrics_port=_port(env, P.ENV_METRICS_PORT, P.METRICS_PORT),
        state_dir=plan.state_dir,
        token_file=Path(token) if token else None,
        layout=EngineLayout(
            num_gpus=cfg.parallel.ep_size,
            gpus_per_node=cfg.parallel.gpus_per_node,
            num_redundant=cfg.eplb.num_redundant_experts,
            num_layers=cfg.model.num_layers,
            num_experts=cfg.model.num_experts,
            top_k=cfg.model.top_k,
            dispatch=cfg.dispatch,
        ),
        identity={"instance": pod.instance, "role": cfg.role, "rank": pod.rank, "engine": "sglang"},
        engine_check=engine_check(engine, pod.rank),
        recorder=recorder_source(cfg, pod.rank, engine, plan.state_dir, env),
    )


def engine_check(engine_url: str, rank: int) -> EngineCheck:
    """Rank 0: SGLang's cheap /ready. Other ranks: the placeholder /health their SGLang serves on
    the same port once its schedulers are ready (it has no /ready)."""
    return EngineCheck(engine_url + ("/ready" if rank == 0 else "/health"))


def recorder_source(
    cfg: EngineConfig, rank: int, engine_url: str, state_dir: Path, env: dict[str, str]
) -> RecorderSource | None:
    """Static mode's load source, on the pod whose SGLang serves the API and writes the dumps
    (global rank 0 lives on node rank 0). Never in modes operator or engine: a dump resets the
    recorder in-engine EPLB reads."""
    if cfg.eplb.mode != "static" or rank != 0 or cfg.parallel.ep_size <= 1:
        return None
    try:
        interval = float(env.get(P.ENV_RECORDER_INTERVAL, "10"))
    except ValueError as exc:
        raise ConfigError(f"{P.ENV_RECORDER_INTERVAL} must be a number of seconds") from exc
    if not 0.1 <= interval <= 3600:
        raise ConfigError(f"{P.ENV_RECORDER_INTERVAL}={interval} must lie in [0.1, 3600] seconds")
    return RecorderSource(engine_url, recorder.recorder_dir(state_dir), interval_s=interval)


def _port(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise ConfigError(f"{name}={raw!r} is not a port number")
    return int(raw)


async def launch(plan: LaunchPlan, opts: SidecarOptions | None = None) -> int:
    for note in plan.init.notes:
        log.warning("%s", note)
    if plan.init.path:
        log.info("initial placement v%s from %s", plan.init.version, plan.init.source)
    start = StartTracker(time.time())
    sup = Supervisor(
        plan.argv,
        plan.env,
        drain_s=plan.cfg.drain_seconds,
        grace_s=plan.cfg.grace_seconds,
        on_line=lambda line: start.feed(line, time.time()),
    )
    opts = opts or sidecar_options(plan)
    opts.alive = sup.alive
    sidecar = Sidecar(opts)
    sidecar.state.start = start
    if plan.init.path is not None:
        doc = exchange.read_json(plan.init.path)
        if isinstance(doc, dict):
            sidecar.state.set_initial(
                "init", plan.init.version, np.asarray(doc["physical_to_logical_map"], dtype=np.int64)
            )
    sup.on_draining = sidecar.set_draining
    await sidecar.start()
    try:
        return await sup.run()
    finally:
        await sidecar.stop()
