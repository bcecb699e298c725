"""The running sidecar: three listeners (API, probes, metrics) and small loops (spool ingest,
engine health, and in static mode the recorder dumps).

The spool loop costs one directory listing per ``poll_s`` when idle; a window costs one
.npz read and a numpy evaluation (see ``moe-runtime bench``). Nothing slow runs on the
event loop, which also serves the probes: ingesting a window, scoring the placement on it
(with static dispatch at EP72 the first score of a new map takes seconds) and reading a
recorder dump (up to ~60 MB) run on one worker thread, in order, so the probe listener keeps
answering meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from moe_contract.pod import METRICS_PORT, PROBE_PORT, SIDECAR_PORT
from moe_runtime import __version__, exchange, recorder
from moe_runtime.sidecar.app import EXTRA_STATUS_KEY, ApiPolicy, api_app, metrics_app, probe_app
from moe_runtime.sidecar.auth import TokenFile
from moe_runtime.sidecar.listener import Limits, Listener
from moe_runtime.sidecar.metrics import RuntimeMetrics
from moe_runtime.sidecar.state import DEFAULT_RING, EngineLayout, SidecarState

log = logging.getLogger("moe_runtime.sidecar")
T = TypeVar("T")

API_LIMITS = Limits(max_connections=64, header_timeout_s=5.0, lifetime_s=60.0)
PROBE_LIMITS = Limits(max_connections=32, header_timeout_s=2.0, lifetime_s=10.0, max_body=0)
METRICS_LIMITS = Limits(max_connections=16, header_timeout_s=5.0, lifetime_s=30.0, max_body=0)


@dataclass(frozen=True)
class EngineCheck:
    """How this pod's engine rank is checked: SGLang's HTTP server on the pod's loopback.

    Rank 0 runs SGLang's real server: ``/ready`` is cheap (``/health`` generates a token, 1-20 s
    under load). Ranks with node_rank >= 1 serve a placeholder ``/health`` on the same port once
    their schedulers are ready (sglang/srt/utils/common.py, launch_dummy_health_check_server),
    and nothing before: their pod is unready until then, and again when it stops answering.
    """

    url: str  # e.g. http://127.0.0.1:30000/ready
    timeout_s: float = 2.0


@dataclass(frozen=True)
class RecorderSource:
    """Static mode, rank 0: windows from SGLang's expert-distribution recorder (moe_runtime.recorder)."""

    engine_url: str  # http://127.0.0.1:<ports.http>
    directory: Path  # $SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR
    interval_s: float = 10.0
    timeout_s: float = 60.0  # a dump all-reduces and writes the whole buffer


@dataclass
class SidecarOptions:
    host: str = "0.0.0.0"
    port: int = SIDECAR_PORT
    probe_port: int = PROBE_PORT
    metrics_port: int = METRICS_PORT
    state_dir: Path = field(default_factory=exchange.state_dir)
    token_file: Path | None = None
    layout: EngineLayout = field(default_factory=EngineLayout)
    identity: dict[str, Any] = field(default_factory=dict)
    engine_check: EngineCheck | None = None  # None: ready while `alive` says the engine runs
    alive: Callable[[], bool] | None = None
    recorder: RecorderSource | None = None
    policy: ApiPolicy = field(default_factory=ApiPolicy)
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
        token = TokenFile(opts.token_file, str(ident.get("instance", "")))  # digests are per instance
        self.app = api_app(self.state, self.metrics, token, ident, opts.policy)
        self.app[EXTRA_STATUS_KEY]["load_source"] = self.load_source
        self.listeners = [
            Listener("api", self.app, opts.host, opts.port, API_LIMITS),
            Listener("probes", probe_app(self.state), opts.host, opts.probe_port, PROBE_LIMITS),
            Listener("metrics", metrics_app(self.metrics), opts.host, opts.metrics_port, METRICS_LIMITS),
        ]
        self.metrics.listener_stats = lambda: {lst.name: lst.stats for lst in self.listeners}
        self._tasks: list[asyncio.Task[None]] = []
        # windows are ingested and scored here, one at a time, never on the event loop
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="moe-sidecar-ingest")

    @property
    def load_source(self) -> str:
        """Where windows come from: the plugin's rebalance hook, or the recorder's dumps."""
        return "recorder" if self.opts.recorder is not None else "rebalance hook"

    def add_routes(self, routes: list[web.RouteDef]) -> None:
        """Extra API routes (the replay engine's /v1/replay); call before start()."""
        self.app.router.add_routes(routes)

    @property
    def ports(self) -> dict[str, int]:
        return {lst.name: lst.port for lst in self.listeners}

    async def start(self) -> None:
        started: list[Listener] = []
        try:
            for lst in self.listeners:
                await lst.start()
                started.append(lst)
        except BaseException:
            for lst in started:
                await lst.stop()
            raise
        self._tasks = [asyncio.create_task(self._poll_loop()), asyncio.create_task(self._health_loop())]
        if self.opts.recorder is not None:
            self._tasks.append(asyncio.create_task(self._recorder_loop(self.opts.recorder)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for lst in self.listeners:
            await lst.stop()
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn`` on the ingest worker (state changes from windows happen there, in order)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def set_draining(self) -> None:
        self.state.draining = True

    # ------------------------------------------------------------ windows

    def ingest(self, records: list[exchange.WindowRecord]) -> None:
        for record in records:
            # score first (the slow part): a window then shows in the API and in the metrics together
            last = record is records[-1]
            evaluation = self.state.evaluate(record.counts) if last else None
            window = self.state.ingest(record)
            if last and evaluation is None:  # the first window may have taught the layout
                evaluation = self.state.evaluate(record.counts)
            self.metrics.observe_window(window, evaluation)

    def poll_once(self) -> int:
        """Ingest spooled windows and plugin files; returns the number of windows taken."""
        refused = self.state.status_refused
        try:  # apart from the windows: a bad plugin file must not hold up the spool
            if self.state.refresh_plugin_files() and self.state.windows:
                # the placement changed: re-score it on the latest traffic
                ev = self.state.evaluate(self.state.windows[-1].record.counts)
                if ev is not None:
                    self.metrics.observe_evaluation(ev)
        except Exception as exc:
            self.metrics.errors.labels("plugin-files").inc()
            log.warning("reading the plugin's files failed: %s", exc)
        if self.state.status_refused > refused:
            self.metrics.errors.labels("plugin-status").inc()
            log.warning(
                "plugin-status.json refused: not as the plugin writes it (kept the status read before)"
            )
        try:
            records = exchange.take_windows(self.opts.state_dir)
            self.ingest(records)
            return len(records)
        except Exception as exc:  # keep serving; count it
            self.metrics.errors.labels("ingest").inc()
            log.warning("ingest failed: %s", exc)
            return 0

    async def _poll_loop(self) -> None:
        while True:
            await self.off_loop(self.poll_once)
            await asyncio.sleep(self.opts.poll_s)

    # ------------------------------------------------------------ engine health

    async def _health_loop(self) -> None:
        check = self.opts.engine_check
        timeout = aiohttp.ClientTimeout(total=check.timeout_s if check else 2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                ready, reason = await self._check(session)
                self.state.engine_ready, self.state.engine_reason = ready, reason
                self.metrics.engine_ready.set(1 if ready else 0)
                # poll faster while the engine is starting so the pod turns ready promptly
                await asyncio.sleep(self.opts.health_s if ready else min(1.0, self.opts.health_s))

    async def _check(self, session: aiohttp.ClientSession) -> tuple[bool, str]:
        alive = self.opts.alive
        if alive is not None and not alive():
            return False, "engine process not running"
        check = self.opts.engine_check
        if check is None:
            return True, "engine process running" if alive else "no engine to check"
        try:
            async with session.get(check.url) as resp:
                if resp.status == 200:
                    return True, "engine ready"
                return False, f"engine {check.url.rsplit('/', 1)[-1]} answered {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            return False, f"engine not answering {check.url}: {type(exc).__name__}"

    # ------------------------------------------------------------ static mode: the recorder

    async def _recorder_loop(self, source: RecorderSource) -> None:
        timeout = aiohttp.ClientTimeout(total=source.timeout_s)
        for old in recorder.take_dumps(source.directory):  # an earlier sidecar's leftovers
            old.unlink(missing_ok=True)
        recording, since = False, time.time()
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await asyncio.sleep(source.interval_s)
                if not self.state.engine_ready:
                    recording = False
                    continue
                try:
                    if not recording:
                        # start resets and turns recording on (off by default unless SGLang
                        # reports balancedness): harmless while in-engine EPLB is off
                        await self._engine_post(session, source.engine_url + recorder.START_PATH)
                        recording, since = True, time.time()
                        continue
                    await self._engine_post(session, source.engine_url + recorder.DUMP_PATH)
                    now = time.time()
                    took = await self.off_loop(self._take_dump, source.directory, since, now)
                    since = now
                    self.metrics.recorder_dumps.labels("ok" if took else "empty").inc()
                except Exception as exc:  # the engine restarts, a file is bad: count it, go on
                    recording = False
                    self.metrics.recorder_dumps.labels("failed").inc()
                    self.metrics.errors.labels("recorder").inc()
                    log.warning("recorder dump failed: %s", exc)

    @staticmethod
    async def _engine_post(session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(url) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                raise RuntimeError(f"POST {url} answered {resp.status}: {text}")

    def _take_dump(self, directory: Path, since: float, now: float) -> bool:
        """Read the newest dump and ingest it as a window (on the worker); False when empty."""
        record = self._read_dumps(directory, since, now)
        if record is not None:
            self.ingest([record])
        return record is not None

    def _read_dumps(self, directory: Path, since: float, now: float) -> exchange.WindowRecord | None:
        """The newest dump as a window (older ones are a previous round's leftovers); files removed."""
        paths = recorder.take_dumps(directory)
        try:
            if not paths:
                return None
            counts, passes = recorder.window(recorder.read_dump(paths[-1]))
        finally:
            for path in paths:
                path.unlink(missing_ok=True)
        lay = self.state.layout
        expected = (lay.num_layers, lay.num_experts)
        if None not in expected and counts.shape != expected:
            raise recorder.DumpError(f"dump of shape {counts.shape}, engine layout {expected}")
        if passes == 0:
            return None
        meta = {"num_physical": lay.num_physical, "num_gpus": lay.num_gpus, "source": "recorder"}
        meta["instance"] = self.opts.identity.get("instance", "")
        return exchange.WindowRecord(counts, passes, since, now, meta)
