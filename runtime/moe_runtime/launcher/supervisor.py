"""Run the engine as a child, drain it on SIGTERM, and exit with its status.

Kubernetes sends SIGTERM to PID 1 (the launcher). The launcher first turns the pod
not-ready (so Services and the router stop sending new requests), waits ``drain_s``,
forwards SIGTERM to SGLang, and after ``grace_s`` kills the engine's whole process
group (SGLang runs schedulers and a detokenizer as children of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("moe_runtime.launcher")


def exit_status(returncode: int) -> int:
    """Shell convention: a child killed by signal N exits 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        drain_s: float,
        grace_s: float,
        on_draining: Callable[[], None] = lambda: None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.drain_s = drain_s
        self.grace_s = grace_s
        self.on_draining = on_draining
        self.proc: asyncio.subprocess.Process | None = None
        self._stop = asyncio.Event()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            self.proc = await asyncio.create_subprocess_exec(*self.argv, env=self.env, start_new_session=True)
            log.info("engine started, pid %d", self.proc.pid)
            waiter = asyncio.create_task(self.proc.wait())
            stopper = asyncio.create_task(self._stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                await self._drain(waiter)
            stopper.cancel()
            code = await waiter
            self._kill_group(signal.SIGKILL)  # leftovers of a child that exited on its own
            log.info("engine exited with %s", code)
            return exit_status(code)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _drain(self, waiter: asyncio.Task[int]) -> None:
        assert self.proc is not None
        log.info("stop requested: draining for %.1fs", self.drain_s)
        self.on_draining()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), self.drain_s)
        if waiter.done():
            return
        log.info("sending SIGTERM to the engine (grace %.1fs)", self.grace_s)
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.grace_s)
        except TimeoutError:
            log.warning("engine ignored SIGTERM for %.1fs: killing its process group", self.grace_s)
            self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
