"""``moe-runtime replay``: a GPU-less engine pod's leader: a stand-in SGLang and the real sidecar.

It lays out ports as an engine pod does: SGLang's HTTP server (``--engine-port``, the config's
``ports.http``: /ready, /health, /metrics with the sglang:* families, the recorder endpoints)
and the sidecar's three listeners (API ``--port``, probes, metrics). The sidecar is the one
``moe-runtime launch`` runs, configured the same way (readiness from the engine's /ready, in
static mode windows from recorder dumps), so an operator, a router probe or Prometheus
cannot tell the pair from a real leader pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from moe_contract import pod as P
from moe_contract.engine import EngineConfig
from moe_placement.maps import PlacementError, validate_map
from moe_runtime import eplb_hook, exchange, recorder
from moe_runtime.config import ConfigError, load_config
from moe_runtime.launcher import init_location
from moe_runtime.replay.engine import ReplayEngine, ReplayOptions
from moe_runtime.replay.engine_http import LIMITS as ENGINE_LIMITS
from moe_runtime.replay.engine_http import engine_app
from moe_runtime.replay.load import LoadConfig, LoadModel, Role
from moe_runtime.replay.sglang_metrics import BUCKETS, EngineLabels, SGLangMetrics
from moe_runtime.replay.trace import TraceConfig
from moe_runtime.sidecar import bodies
from moe_runtime.sidecar.app import ApiPolicy, read_json
from moe_runtime.sidecar.listener import Listener
from moe_runtime.sidecar.service import EngineCheck, RecorderSource, Sidecar, SidecarOptions
from moe_runtime.sidecar.state import EngineLayout


@dataclass(frozen=True)
class Preset:
    layers: int
    dense: int
    experts: int
    top_k: int
    groups: int | None


PRESETS = {
    "deepseek-v3": Preset(61, 3, 256, 8, 8),
    "qwen3-30b-a3b": Preset(48, 0, 128, 8, None),
    "tiny": Preset(4, 1, 16, 2, None),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port", type=int, default=None, help="API port (default: the config's sidecar port, else 9400)"
    )
    p.add_argument("--probe-port", type=int, default=P.PROBE_PORT, help="probe listener (0: any free port)")
    p.add_argument("--metrics-port", type=int, default=P.METRICS_PORT, help="metrics listener (0: any)")
    p.add_argument(
        "--engine-port", type=int, default=None, help="SGLang's HTTP port (default: ports.http, else 30000)"
    )
    p.add_argument(
        "--engine-config", default=None, help="an EngineConfig JSON to take shapes and EPLB settings from"
    )
    p.add_argument("--state-dir", default=None, help="exchange directory (default: a new temp dir)")
    p.add_argument("--token-file", default=None, help="bearer token file for the API")
    p.add_argument(
        "--reads",
        choices=["open", "token"],
        default="open",
        help="token: every API route needs the token, as with `launch`. open (tests that read without "
        "it): GET routes without the token, and /healthz, /readyz, /metrics also on the API port",
    )
    p.add_argument("--model", choices=sorted(PRESETS), default="deepseek-v3", help="shape preset")
    p.add_argument("--layers", type=int)
    p.add_argument("--dense-layers", type=int)
    p.add_argument("--experts", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--gpus", type=int, help="EP size")
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--attn-dp", type=int, help="attention DP width (default: the config's, else 1)")
    p.add_argument("--redundant", type=int, help="redundant expert slots")
    p.add_argument("--tokens-per-pass", type=int, default=4096)
    p.add_argument("--rebalance-iterations", type=int, help="passes between rebalances; recorder buffer")
    p.add_argument("--pass-interval", type=float, default=0.05, help="seconds between passes (0: flat out)")
    p.add_argument("--dispatch", choices=["static", "dynamic"])
    p.add_argument("--eplb-mode", choices=["operator", "engine", "static", "off"])
    p.add_argument("--placement-file", help="mounted operator placement (ConfigMap)")
    p.add_argument("--placement-max-age", type=float)
    p.add_argument("--planner", choices=["on", "off"], default="on")
    p.add_argument("--drift-period", type=float, default=4096.0, help="passes per cycle of the traffic mix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--role", choices=["prefill", "decode", "standalone"])
    p.add_argument("--instance", default="replay")
    p.add_argument("--poll-interval", type=float, default=1.0, help="sidecar spool poll period, seconds")
    p.add_argument(
        "--recorder-interval", type=float, default=2.0, help="static mode: seconds between recorder dumps"
    )
    p.add_argument("--request-rate", type=float, default=LoadConfig.request_rate, help="offered requests/s")
    p.add_argument("--max-running", type=int, default=LoadConfig.max_running, help="batch size cap")
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=LoadConfig.kv_tokens,
        help="the KV pool in tokens (SGLang's max_total_num_tokens; the instance's width sets it)",
    )
    p.add_argument(
        "--itl-per-request",
        type=float,
        default=LoadConfig.itl_per_request_s,
        help="seconds a decode pass gains per running request (a wider instance spreads its batch over more GPUs)",
    )
    p.add_argument("--prompt-tokens", type=int, default=LoadConfig.prompt_tokens, help="mean prompt length")
    p.add_argument("--output-tokens", type=int, default=LoadConfig.output_tokens, help="mean output length")


def _pick(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


@dataclass(frozen=True)
class ReplaySetup:
    opts: ReplayOptions
    settings: eplb_hook.HookSettings
    identity: dict[str, Any]
    labels: EngineLabels
    load: LoadConfig
    role: Role


def options_from_args(args: argparse.Namespace, cfg: EngineConfig | None) -> ReplaySetup:
    preset = PRESETS[args.model]
    facts = cfg.model if cfg else None
    layers = _pick(args.layers, facts and facts.num_layers, preset.layers)
    experts = _pick(args.experts, facts and facts.num_experts, preset.experts)
    dense = _pick(args.dense_layers, min(preset.dense, layers - 1))
    trace = TraceConfig(
        num_layers=layers - dense,
        num_experts=experts,
        top_k=_pick(args.top_k, facts and facts.top_k, preset.top_k),
        tokens_per_step=args.tokens_per_pass,
        drift_period=args.drift_period,
        seed=args.seed,
    )
    role: Role = _pick(args.role, cfg and cfg.role, "decode")
    mode = _pick(args.eplb_mode, cfg and cfg.eplb.mode, "operator")
    gpus = _pick(args.gpus, cfg and cfg.parallel.ep_size, 32)
    metrics_on = cfg.enable_metrics if cfg else True
    opts = ReplayOptions(
        trace=trace,
        dense_layers=dense,
        num_gpus=gpus,
        gpus_per_node=_pick(args.gpus_per_node, cfg and cfg.parallel.gpus_per_node, 8),
        num_redundant=_pick(args.redundant, cfg and cfg.eplb.num_redundant_experts, 32),
        num_groups=_pick(facts and facts.num_groups, preset.groups if experts == preset.experts else None),
        rebalance_iterations=_pick(args.rebalance_iterations, cfg and cfg.eplb.rebalance_iterations, 1000),
        pass_interval_s=args.pass_interval,
        dispatch=_pick(args.dispatch, cfg and cfg.dispatch, "static"),
        forward_mode="extend" if role == "prefill" else "decode",
        mode=mode,
        # SGLang starts recording at boot when it reports balancedness (the launcher's EP > 1)
        auto_record=metrics_on and gpus > 1,
    )
    placement_file = _pick(args.placement_file, cfg and cfg.eplb.placement_file)
    settings = eplb_hook.HookSettings(
        mode=mode,
        state_dir=Path(args.state_dir),
        placement_file=Path(placement_file) if placement_file else None,
        max_age_s=_pick(
            args.placement_max_age, cfg and cfg.eplb.placement_max_age_seconds, eplb_hook.DEFAULT_MAX_AGE
        ),
        dispatch=opts.dispatch,
        use_planner=args.planner == "on",
        instance=args.instance,
    )
    model = cfg.model_path if cfg else args.model
    served = (cfg.served_model_name or cfg.model_path) if cfg else args.model
    identity = {"instance": args.instance, "role": role, "engine": "replay", "model": model, "mode": mode}
    labels = EngineLabels(
        model_name=served,
        engine_type={"prefill": "prefill", "decode": "decode"}.get(role, "unified"),
        tp_size=_pick(cfg and cfg.parallel.tp_size, gpus),
        attn_dp=_pick(args.attn_dp, cfg and cfg.parallel.attn_dp, 1),
        ep_size=gpus,
        report_balancedness=opts.auto_record,
    )
    for flag in ("max_running", "kv_tokens", "prompt_tokens", "output_tokens"):
        value = getattr(args, flag)
        if not 1 <= value <= 1 << 40:
            raise ConfigError(f"--{flag.replace('_', '-')} must be an integer in [1, 2**40], got {value}")
    if not (math.isfinite(args.itl_per_request) and 0 <= args.itl_per_request <= 1):
        raise ConfigError(f"--itl-per-request must be seconds in [0, 1], got {args.itl_per_request}")
    load = LoadConfig(
        request_rate=args.request_rate,
        max_running=args.max_running,
        itl_per_request_s=args.itl_per_request,
        kv_tokens=args.kv_tokens,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
    )
    return ReplaySetup(opts, settings, identity, labels, load, role)


def boot_map(cfg: EngineConfig | None, setup: ReplaySetup, state_dir: Path) -> tuple[Any, int | None] | None:
    """The map the engine boots with: the launcher's --init-expert-location choice."""
    if setup.opts.mode == "off":
        return None
    if cfg is not None:
        init = init_location.prepare(cfg, state_dir)
        if init.path is None:
            return None
        doc = exchange.read_json(init.path) or {}
        return np.asarray(doc["physical_to_logical_map"], dtype=np.int64), init.version
    path = setup.settings.placement_file
    if path is None:
        return None
    doc, _ = exchange.CachedPlacementFile(path).load()
    if doc is None:
        return None
    o = setup.opts
    try:
        arr = validate_map(
            doc.physical_to_logical_map,
            num_layers=o.num_layers,
            num_logical=o.trace.num_experts,
            num_physical=o.num_physical,
            num_gpus=o.num_gpus,
        )
    except PlacementError:
        return None
    return arr, doc.version


def _with_placement_file(cfg: EngineConfig, path: str | None) -> EngineConfig:
    if path is None:
        return cfg
    return cfg.model_copy(update={"eplb": cfg.eplb.model_copy(update={"placement_file": path})})


async def serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.engine_config) if args.engine_config else None
    if cfg is not None:
        cfg = _with_placement_file(cfg, args.placement_file)
    if args.state_dir is None:
        args.state_dir = tempfile.mkdtemp(prefix="moe-replay-")
    setup = options_from_args(args, cfg)
    opts, state_dir = setup.opts, setup.settings.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    if not (0.05 <= args.recorder_interval <= 3600):
        raise ConfigError("--recorder-interval must lie in [0.05, 3600] seconds")

    from prometheus_client import CollectorRegistry

    load = LoadModel(setup.load, setup.role, BUCKETS, time.monotonic())
    registry = CollectorRegistry()
    sglang = SGLangMetrics(registry, setup.labels, load)
    engine = ReplayEngine(opts, eplb_hook.HookState(setup.settings), sglang, load)
    booted = boot_map(cfg, setup, state_dir)
    if booted is not None:
        engine.set_map(booted[0])
    thread = threading.Thread(target=engine.run, name="replay", daemon=True)

    directory = recorder.recorder_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    engine_port = _pick(args.engine_port, cfg and cfg.ports.http, 30000)
    engine_listener = Listener(
        "engine",
        engine_app(engine, registry, thread.is_alive, directory),
        args.host,
        engine_port,
        ENGINE_LIMITS,
    )
    await engine_listener.start()
    local = "127.0.0.1" if args.host in ("", "0.0.0.0") else args.host
    engine_url = f"http://{local}:{engine_listener.port}"
    o = opts
    sidecar = Sidecar(
        SidecarOptions(
            host=args.host,
            port=_pick(args.port, cfg and cfg.ports.sidecar, P.SIDECAR_PORT),
            probe_port=args.probe_port,
            metrics_port=args.metrics_port,
            state_dir=state_dir,
            token_file=Path(args.token_file) if args.token_file else None,
            layout=EngineLayout(
                num_gpus=o.num_gpus,
                gpus_per_node=o.gpus_per_node,
                num_redundant=o.num_redundant,
                num_layers=o.num_layers,
                num_experts=o.trace.num_experts,
                top_k=o.trace.top_k,
                dispatch=o.dispatch,
            ),
            identity=setup.identity,
            engine_check=EngineCheck(engine_url + "/ready"),
            alive=thread.is_alive,
            # the launcher's rule (launcher.run.recorder_source): static mode, the leader, EP > 1
            recorder=(
                RecorderSource(engine_url, directory, interval_s=args.recorder_interval)
                if o.mode == "static" and o.num_gpus > 1
                else None
            ),
            policy=ApiPolicy(open_reads=args.reads == "open"),
            poll_s=args.poll_interval,
            health_s=1.0,
        )
    )
    if booted is not None:
        sidecar.state.set_initial("init", booted[1], booted[0])
    sidecar.add_routes(replay_routes(engine, load))
    try:
        await sidecar.start()
    except BaseException:
        await engine_listener.stop()
        raise
    thread.start()
    ports = {"engine": engine_listener.port, **sidecar.ports}
    print(
        f"moe-runtime replay: serving on {args.host} ports {ports} (state dir {state_dir}, "
        f"{o.num_layers}x{o.trace.num_experts} experts, {o.num_gpus} GPUs, eplb mode {o.mode})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        engine.stop()
        with contextlib.suppress(RuntimeError):
            await asyncio.to_thread(thread.join, 5)
        await sidecar.stop()
        await engine_listener.stop()
    return 0


def replay_routes(engine: ReplayEngine, load: LoadModel) -> list[web.RouteDef]:
    """Test and demo facilities on the API (token-protected writes)."""

    async def replay_status(request: web.Request) -> web.Response:
        d = engine.last_decision
        rec = engine.recorder
        snap = load.snapshot()
        return web.json_response(
            {
                "mode": engine.opts.mode,
                "passes": engine.passes,
                "rebalances": engine.rebalances,
                "shifts": engine.shifts,
                "recorder": {"recording": rec.recording, "dumps": rec.dumps} if rec else None,
                "load": {
                    "request_rate": snap.rate,
                    "running": snap.running,
                    "queued": snap.queued,
                    "dropped": load.dropped,
                    "too_long": load.too_long,
                    "token_usage": snap.token_usage,
                    "kv_tokens": load.config.kv_tokens,
                },
                "last_decision": {"source": d.source, "version": d.version, "reason": d.reason}
                if d
                else None,
                "domain_mix": dict(
                    zip(
                        [d for d, _ in engine.trace.config.domains],
                        engine.trace.batch_mix().tolist(),
                        strict=True,
                    )
                ),
            }
        )

    async def replay_shift(request: web.Request) -> web.Response:
        """Move the hot experts (seed: a non-negative integer; default a new one per shift)."""
        try:
            body = await read_json(request, frozenset({"seed"}), "shift", empty={})
        except bodies.BadBody as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        seed = body.get("seed")
        if seed is None:
            seed = engine.opts.trace.seed + 1000 * (engine.shifts + 1)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            return web.json_response({"error": "seed must be an integer in [0, 2**32)"}, status=400)
        engine.request_shift(seed)
        return web.json_response({"seed": seed, "shifts_before": engine.shifts})

    async def replay_load(request: web.Request) -> web.Response:
        """Set the offered load: {"requestRate": requests per second}."""
        try:
            body = await read_json(request, frozenset({"requestRate"}), "load")
        except bodies.BadBody as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        rate = body.get("requestRate")
        try:
            if isinstance(rate, bool) or not isinstance(rate, int | float):
                raise ValueError("requestRate must be a number of requests per second")
            before = load.snapshot().rate
            load.set_rate(float(rate))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"requestRate": float(rate), "before": before})

    return [
        web.get("/v1/replay", replay_status),
        web.post("/v1/replay/shift", replay_shift),
        web.post("/v1/replay/load", replay_load),
    ]
