"""The replay engine's stand-in for SGLang's HTTP server (the engine's `http` port).

What the runtime and Prometheus use of SGLang 0.5.23's server
(sglang/srt/entrypoints/http_server.py), with its paths, methods and answers:

- ``GET /ready``: 200 while the engine serves, else 503 (cheap, no generation);
- ``GET /health``, ``/health_generate``: 200 / 503 (SGLang generates a token here; the replay
  has nothing to generate);
- ``GET /metrics``: the sglang:* families (replay.sglang_metrics);
- ``GET|POST /start_expert_distribution_record``, ``/stop_...``, ``/dump_...``: plain-text
  answers; a dump writes rank 0's file into the recorder directory and resets the recorder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from moe_runtime import recorder
from moe_runtime.replay.engine import RecorderUnavailable, ReplayEngine, StandInRecorder
from moe_runtime.sidecar.listener import Limits, one_request_per_connection

LIMITS = Limits(max_connections=64, header_timeout_s=5.0, lifetime_s=60.0, max_body=1 << 16)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def engine_app(
    engine: ReplayEngine, registry: CollectorRegistry, alive: Callable[[], bool], recorder_dir: Path
) -> web.Application:
    app = web.Application(middlewares=[one_request_per_connection])

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200 if alive() else 503)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def recorder_route(action: Callable[[], object], answer: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            try:
                await asyncio.to_thread(action)
            except RecorderUnavailable as exc:
                return web.Response(status=500, text=f"{exc}\n")
            return web.Response(text=answer)

        return handler

    def need_recorder() -> StandInRecorder:
        if engine.recorder is None:
            raise RecorderUnavailable(
                "Please set ServerArgs.expert_distribution_recorder_mode to use ExpertDistributionRecorder."
            )
        return engine.recorder

    routes = [
        (recorder.START_PATH, lambda: need_recorder().start(), "Start recording the expert distribution.\n"),
        ("/stop_expert_distribution_record", lambda: need_recorder().stop(), "Stop recording the expert distribution.\n"),
        (recorder.DUMP_PATH, lambda: engine.dump(recorder_dir), "Dump expert distribution record.\n"),
    ]  # fmt: skip
    for path, action, answer in routes:
        handler = recorder_route(action, answer)
        app.router.add_get(path, handler)
        app.router.add_post(path, handler)
    app.router.add_get("/ready", ready)
    app.router.add_get("/health", ready)
    app.router.add_get("/health_generate", ready)
    app.router.add_get("/metrics", metrics)
    return app
