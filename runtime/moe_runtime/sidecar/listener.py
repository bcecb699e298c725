"""One TCP listener of the sidecar: an aiohttp app behind a guard that bounds its peers.

aiohttp bounds line and header sizes but not how many connections a peer may hold, nor how
long it may take to send its headers: 500 slow partial requests would hold 500 handlers
for as long as the peer likes (issue 15). The guard, a protocol wrapped around aiohttp's
own, gives every listener:

- a cap on open connections; at the cap a new connection evicts the oldest one that has
  not finished its headers (a slow-loris peer loses its slot to a prompt client, so a
  kubelet probe still gets in), and is refused with 503 only when every slot serves a
  request;
- a deadline for the request's headers and one for the connection's whole life;
- one request per connection (responses carry ``Connection: close``), so both deadlines
  bound everything a peer can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("moe_runtime.sidecar")

REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_END_OF_HEADERS = (b"\r\n\r\n", b"\n\n")


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    header_timeout_s: float = 5.0  # connection accepted -> end of the request's headers
    lifetime_s: float = 60.0  # connection accepted -> closed, whatever it does
    max_body: int = 1 << 20  # request bodies (a DeepSeek-V3 placement is ~70 kB of JSON)


class _Pool:
    """The open connections of one listener, oldest first."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[_Guard, None] = {}
        self.evicted = 0
        self.refused = 0

    def admit(self, guard: _Guard) -> bool:
        if len(self.open) >= self.limits.max_connections:
            victim = next((g for g in self.open if not g.headers_done), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            del self.open[victim]  # now: its connection_lost comes later, from the loop
            victim.abort()
        self.open[guard] = None
        return True

    def release(self, guard: _Guard) -> None:
        self.open.pop(guard, None)


class _Guard(asyncio.Protocol):
    """Forwards to aiohttp's protocol; enforces the pool's cap and the two deadlines."""

    def __init__(self, inner: asyncio.Protocol, pool: _Pool) -> None:
        self.inner = inner
        self.pool = pool
        self.headers_done = False
        self._tail = b""
        self._transport: asyncio.Transport | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self.pool.admit(self):
            transport.write(REFUSED)
            transport.close()
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        limits = self.pool.limits
        self._timers = [
            loop.call_later(limits.header_timeout_s, self._header_deadline),
            loop.call_later(limits.lifetime_s, self.abort),
        ]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self.headers_done:
            seen = self._tail + data
            if any(mark in seen for mark in _END_OF_HEADERS):
                self.headers_done = True
                self._timers[0].cancel()
            else:
                self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers:
            timer.cancel()
        self.pool.release(self)
        if self._admitted:
            self.inner.connection_lost(exc)

    def _header_deadline(self) -> None:
        if not self.headers_done:
            self.abort()

    def abort(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite with every connection wrapped in a _Guard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: Limits) -> None:
        super().__init__(runner, backlog=max(128, limits.max_connections))
        self._host = host
        self._port = port
        self.pool = _Pool(limits)

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        pool = self.pool

        def factory() -> asyncio.Protocol:
            return _Guard(server(), pool)

        self._server = await asyncio.get_running_loop().create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        if self._server.sockets:
            self._port = int(self._server.sockets[0].getsockname()[1])


@web.middleware
async def one_request_per_connection(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        resp = await handler(request)
    except web.HTTPException as exc:
        exc.force_close()
        raise
    resp.force_close()
    return resp


class Listener:
    """An app served on host:port behind the guard; port 0 picks a free one."""

    def __init__(self, name: str, app: web.Application, host: str, port: int, limits: Limits) -> None:
        self.name = name
        self.app = app
        self.host = host
        self.limits = limits
        self._port = port
        self._runner: web.AppRunner | None = None
        self._site: GuardedSite | None = None

    @property
    def port(self) -> int:
        return self._site.port if self._site is not None else self._port

    @property
    def stats(self) -> dict[str, Any]:
        pool = self._site.pool if self._site else None
        return {
            "open": len(pool.open) if pool else 0,
            "evicted": pool.evicted if pool else 0,
            "refused": pool.refused if pool else 0,
        }

    async def start(self) -> None:
        # auto_decompress off: a gzip body could inflate far past max_body before it is counted
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            auto_decompress=False,
            max_headers=32,
            keepalive_timeout=5,
            lingering_time=1.0,  # reading an unread body after answering (a refused push)
            shutdown_timeout=2.0,
        )
        await self._runner.setup()
        self._site = GuardedSite(self._runner, self.host, self._port, self.limits)
        await self._site.start()
        log.info("%s listening on %s:%d", self.name, self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
