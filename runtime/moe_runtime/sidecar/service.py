"""The running sidecar: HTTP server plus two small loops (spool ingest, engine health).

The spool loop costs one directory listing per ``poll_s`` when idle; a window costs one
.npz read and a numpy evaluation (see ``moe-runtime bench``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from moe_contract.pod import SIDECAR_PORT
from moe_runtime import __version__, exchange
from moe_runtime.sidecar.app import build_app
from moe_runtime.sidecar.auth import TokenFile
from moe_runtime.sidecar.metrics import RuntimeMetrics
from moe_runtime.sidecar.state import DEFAULT_RING, EngineLayout, SidecarState

log = logging.getLogger("moe_runtime.sidecar")


@dataclass
class SidecarOptions:
    host: str = "0.0.0.0"
    port: int = SIDECAR_PORT
    state_dir: Path = field(default_factory=exchange.state_dir)
    token_file: Path | None = None
    layout: EngineLayout = field(default_factory=EngineLayout)
    identity: dict[str, Any] = field(default_factory=dict)
    engine_health_url: str | None = None  # SGLang's /health on the leader pod
    alive: Callable[[], bool] | None = None  # readiness of pods without an HTTP engine
    poll_s: float = 1.0
    health_s: float = 5.0
    ring_size: int = DEFAULT_RING


class Sidecar:
    def __init__(self, opts: SidecarOptions, registry: CollectorRegistry | None = None) -> None:
        self.opts = opts
        opts.state_dir.mkdir(parents=True, exist_ok=True)
        self.state = SidecarState(opts.state_dir, opts.layout, ring_size=opts.ring_size)
        self.metrics = RuntimeMetrics(self.state, registry)
        ident = opts.identity
        self.metrics.info.labels(ident.get("instance", ""), ident.get("role", ""), __version__).set(1)
        self.app = build_app(self.state, self.metrics, TokenFile(opts.token_file), ident)
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def add_routes(self, routes: list[web.RouteDef]) -> None:
        """Extra routes (the replay engine adds SGLang's /health); call before start()."""
        self.app.router.add_routes(routes)

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.opts.host, self.opts.port)
        await site.start()
        self._tasks = [asyncio.create_task(self._poll_loop()), asyncio.create_task(self._health_loop())]
        log.info("sidecar listening on %s:%d", self.opts.host, self.opts.port)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()

    def set_draining(self) -> None:
        self.state.draining = True

    def poll_once(self) -> int:
        """Ingest spooled windows and plugin files; returns the number of windows taken."""
        try:
            if self.state.refresh_plugin_files() and self.state.windows:
                # the placement changed: re-score it on the latest traffic
                ev = self.state.evaluate(self.state.windows[-1].record.counts)
                if ev is not None:
                    self.metrics.observe_evaluation(ev)
            records = exchange.take_windows(self.opts.state_dir)
            for record in records:
                window = self.state.ingest(record)
                evaluation = self.state.evaluate(record.counts) if record is records[-1] else None
                self.metrics.observe_window(window, evaluation)
            return len(records)
        except Exception as exc:  # keep serving; count it
            self.metrics.errors.labels("ingest").inc()
            log.warning("ingest failed: %s", exc)
            return 0

    async def _poll_loop(self) -> None:
        while True:
            self.poll_once()
            await asyncio.sleep(self.opts.poll_s)

    async def _health_loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, min(5.0, self.opts.health_s)))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                ready, reason = await self._check(session)
                self.state.engine_ready, self.state.engine_reason = ready, reason
                self.metrics.engine_ready.set(1 if ready else 0)
                # poll faster while the engine is starting so the pod turns ready promptly
                await asyncio.sleep(self.opts.health_s if ready else min(1.0, self.opts.health_s))

    async def _check(self, session: aiohttp.ClientSession) -> tuple[bool, str]:
        url = self.opts.engine_health_url
        if url is None:
            alive = self.opts.alive
            if alive is None or alive():
                return True, "engine process running" if alive else "no engine to check"
            return False, "engine process not running"
        if self.opts.alive is not None and not self.opts.alive():
            return False, "engine process not running"
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return True, "engine healthy"
                return False, f"engine health returned {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            return False, f"engine not reachable: {type(exc).__name__}"
