"""Run the engine as a child, drain it on SIGTERM, and exit with its status.

Kubernetes sends SIGTERM to PID 1 (the launcher). The launcher first turns the pod
not-ready (so Services and the router stop sending new requests), waits ``drain_s``,
forwards SIGTERM to SGLang, and after ``grace_s`` kills the engine's whole process
group (SGLang runs schedulers and a detokenizer as children of its own).

Given ``on_line``, the engine writes into two pipes instead of the container's stdout and
stderr: one thread per pipe copies each chunk on to the same stream as it arrives (kubectl logs
shows the same bytes, unbuffered) and hands the lines to ``on_line`` (startup.StartTracker). The
threads read until the last writer closes the pipe, whatever ``on_line`` or our own stdout does,
so the engine never blocks on a pipe nobody reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence

from moe_runtime.launcher.startup import LineBuffer

log = logging.getLogger("moe_runtime.launcher")
CHUNK = 64 * 1024
PIPE_SIZE = 1 << 20  # room for the engine's output while our reader waits for the GIL
FLUSH_S = 2.0  # after the engine exits: how long its last output may take to come through


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
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.drain_s = drain_s
        self.grace_s = grace_s
        self.on_draining = on_draining
        self.on_line = on_line
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
        pumps: list[threading.Thread] = []
        try:
            if self.on_line is None:
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv, env=self.env, start_new_session=True
                )
            else:
                self.proc, pumps = await self._start_piped(self.on_line)
            log.info("engine started, pid %d", self.proc.pid)
            waiter = asyncio.create_task(self.proc.wait())
            stopper = asyncio.create_task(self._stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                await self._drain(waiter)
            stopper.cancel()
            code = await waiter
            self._kill_group(signal.SIGKILL)  # leftovers of a child that exited on its own
            for thread in pumps:  # its last words (a traceback) before ours
                await asyncio.to_thread(thread.join, FLUSH_S)
            log.info("engine exited with %s", code)
            return exit_status(code)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _start_piped(
        self, on_line: Callable[[str], None]
    ) -> tuple[asyncio.subprocess.Process, list[threading.Thread]]:
        pipes = [os.pipe(), os.pipe()]  # (read, write) for the engine's stdout, stderr
        try:
            for _, write in pipes:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, start_new_session=True, stdout=pipes[0][1], stderr=pipes[1][1]
            )
        except BaseException:
            for read, _ in pipes:
                os.close(read)
            raise
        finally:
            for _, write in pipes:  # the engine holds them now; EOF when its last process exits
                os.close(write)
        pumps = [
            threading.Thread(target=pump, args=(read, out, on_line), name=f"engine-{name}", daemon=True)
            for (read, _), out, name in zip(pipes, (1, 2), ("stdout", "stderr"), strict=True)
        ]
        for thread in pumps:
            thread.start()
        return proc, pumps

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


def pump(src: int, dst: int, on_line: Callable[[str], None]) -> None:
    """Copy ``src`` to ``dst`` chunk by chunk and hand its lines to ``on_line``, until EOF. A
    failing ``on_line`` stops the tracking, a failing ``dst`` the copy, never the reading."""
    lines: LineBuffer | None = LineBuffer()
    copy = True
    try:
        while chunk := _read(src):
            if copy:
                try:
                    _write_all(dst, chunk)
                except OSError as exc:
                    copy = False
                    log.warning("engine output to fd %d lost from here: %s", dst, exc)
            if lines is not None:
                try:
                    for line in lines.feed(chunk):
                        on_line(line)
                except Exception:
                    lines = None
                    log.exception("reading the engine's start-up phase from its output stopped")
    finally:
        os.close(src)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, CHUNK)
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
