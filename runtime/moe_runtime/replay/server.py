"""``moe-runtime replay``: the replay engine behind the sidecar API on one port.

Besides the sidecar's endpoints it answers SGLang's ``/health`` and ``/health_generate``,
and its ``/metrics`` carries SGLang's metric names next to the sidecar's, so an operator,
a router probe or Prometheus cannot tell it from a real engine pod's leader.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from moe_contract.engine import EngineConfig
from moe_contract.pod import SIDECAR_PORT
from moe_runtime import eplb_hook, exchange
from moe_runtime.config import load_config
from moe_runtime.launcher import init_location
from moe_runtime.replay.engine import ReplayEngine, ReplayOptions
from moe_runtime.replay.sglang_metrics import SGLangMetrics
from moe_runtime.replay.trace import TraceConfig
from moe_runtime.sidecar.app import TOKEN_KEY
from moe_runtime.sidecar.service import Sidecar, SidecarOptions
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
    p.add_argument(
        "--engine-config", default=None, help="an EngineConfig JSON to take shapes and EPLB settings from"
    )
    p.add_argument("--state-dir", default=None, help="exchange directory (default: a new temp dir)")
    p.add_argument("--token-file", default=None, help="bearer token file for placement pushes")
    p.add_argument("--model", choices=sorted(PRESETS), default="deepseek-v3", help="shape preset")
    p.add_argument("--layers", type=int)
    p.add_argument("--dense-layers", type=int)
    p.add_argument("--experts", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--gpus", type=int, help="EP size")
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--redundant", type=int, help="redundant expert slots")
    p.add_argument("--tokens-per-pass", type=int, default=4096)
    p.add_argument("--rebalance-iterations", type=int)
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


def _pick(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def options_from_args(
    args: argparse.Namespace, cfg: EngineConfig | None
) -> tuple[ReplayOptions, eplb_hook.HookSettings, dict[str, Any]]:
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
    role = _pick(args.role, cfg and cfg.role, "decode")
    opts = ReplayOptions(
        trace=trace,
        dense_layers=dense,
        num_gpus=_pick(args.gpus, cfg and cfg.parallel.ep_size, 32),
        gpus_per_node=_pick(args.gpus_per_node, cfg and cfg.parallel.gpus_per_node, 8),
        num_redundant=_pick(args.redundant, cfg and cfg.eplb.num_redundant_experts, 32),
        num_groups=_pick(facts and facts.num_groups, preset.groups if experts == preset.experts else None),
        rebalance_iterations=_pick(args.rebalance_iterations, cfg and cfg.eplb.rebalance_iterations, 1000),
        pass_interval_s=args.pass_interval,
        dispatch=_pick(args.dispatch, cfg and cfg.dispatch, "static"),
        forward_mode="extend" if role == "prefill" else "decode",
    )
    placement_file = _pick(args.placement_file, cfg and cfg.eplb.placement_file)
    settings = eplb_hook.HookSettings(
        mode=_pick(args.eplb_mode, cfg and cfg.eplb.mode, "operator"),
        state_dir=Path(args.state_dir),
        placement_file=Path(placement_file) if placement_file else None,
        max_age_s=_pick(
            args.placement_max_age, cfg and cfg.eplb.placement_max_age_seconds, eplb_hook.DEFAULT_MAX_AGE
        ),
        dispatch=opts.dispatch,
        use_planner=args.planner == "on",
        instance=args.instance,
    )
    identity = {
        "instance": args.instance,
        "role": role,
        "engine": "replay",
        "model": cfg.model_path if cfg else args.model,
    }
    return opts, settings, identity


async def serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.engine_config) if args.engine_config else None
    if args.state_dir is None:
        args.state_dir = tempfile.mkdtemp(prefix="moe-replay-")
    opts, settings, identity = options_from_args(args, cfg)
    state_dir = settings.state_dir
    sidecar = Sidecar(
        SidecarOptions(
            host=args.host,
            port=_pick(args.port, cfg and cfg.ports.sidecar, SIDECAR_PORT),
            state_dir=state_dir,
            token_file=Path(args.token_file) if args.token_file else None,
            layout=EngineLayout(
                num_gpus=opts.num_gpus,
                gpus_per_node=opts.gpus_per_node,
                num_redundant=opts.num_redundant,
                num_layers=opts.num_layers,
                num_experts=opts.trace.num_experts,
                top_k=opts.trace.top_k,
                dispatch=opts.dispatch,
            ),
            identity=identity,
            poll_s=args.poll_interval,
            health_s=1.0,
        )
    )
    engine_type = {"prefill": "prefill", "decode": "decode"}.get(identity["role"], "unified")
    sglang = SGLangMetrics(
        sidecar.metrics.registry, model_name=str(identity["model"]), engine_type=engine_type
    )
    engine = ReplayEngine(opts, eplb_hook.HookState(settings), sglang)
    if cfg is not None:
        init = init_location.prepare(cfg, state_dir)
        if init.path is not None:
            doc = exchange.read_json(init.path) or {}
            arr = np.asarray(doc["physical_to_logical_map"], dtype=np.int64)
            engine.set_map(arr)
            sidecar.state.set_initial("init", init.version, arr)
    thread = threading.Thread(target=engine.run, name="replay", daemon=True)
    sidecar.opts.alive = thread.is_alive

    async def health(request: web.Request) -> web.Response:
        return web.Response(
            text="" if thread.is_alive() else "replay stopped", status=200 if thread.is_alive() else 503
        )

    async def replay_status(request: web.Request) -> web.Response:
        d = engine.last_decision
        return web.json_response(
            {
                "passes": engine.passes,
                "rebalances": engine.rebalances,
                "shifts": engine.shifts,
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
        """Test/demo facility: move the hot experts (same bearer token as placement pushes)."""
        allowed, why = request.app[TOKEN_KEY].check(request.headers.get("Authorization"))
        if not allowed:
            status = 503 if why.startswith("writes are disabled") else 401
            return web.json_response({"error": why}, status=status, headers={"WWW-Authenticate": "Bearer"})
        try:
            body: Any = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        seed = body.get("seed") if isinstance(body, dict) else None
        if seed is None:
            seed = opts.trace.seed + 1000 * (engine.shifts + 1)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            return web.json_response({"error": "seed must be a non-negative integer"}, status=400)
        engine.request_shift(seed)
        return web.json_response({"seed": seed, "shifts_before": engine.shifts})

    sidecar.add_routes(
        [
            web.get("/health", health),
            web.get("/health_generate", health),
            web.get("/v1/replay", replay_status),
            web.post("/v1/replay/shift", replay_shift),
        ]
    )
    await sidecar.start()
    thread.start()
    print(
        f"moe-runtime replay: serving on http://{sidecar.opts.host}:{sidecar.opts.port} "
        f"(state dir {state_dir}, {opts.num_layers}x{opts.trace.num_experts} experts, "
        f"{opts.num_gpus} GPUs)",
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
    return 0
