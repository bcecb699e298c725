"""A hostile engine runtime for the security tests: serves /v1/windows answers meant to hurt the
operator's collector, cycling per request through: huge (200 MB), slow (a byte a second), and
windows dated an hour in the future. Every request it sees is appended to a log (method, path,
Authorization header), so tests can tell who talked to it and with which credentials.

    python hostile_runtime.py HOST PORT LOG LAYERS EXPERTS
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web

HUGE_BYTES = 200 * 2**20


def main() -> None:
    host, port, log, layers, experts = (
        sys.argv[1],
        int(sys.argv[2]),
        sys.argv[3],
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    modes = ["huge", "slow", "future"]
    state = {"n": 0}

    async def record(request: web.Request) -> None:
        with open(log, "a") as fh:
            fh.write(json.dumps({"method": request.method, "path": request.path,
                                 "auth": request.headers.get("Authorization", "")}) + "\n")  # fmt: skip

    async def windows(request: web.Request) -> web.StreamResponse:
        await record(request)
        mode = modes[state["n"] % len(modes)]
        state["n"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if mode == "huge":
            await resp.write(b'{"windows": [{"seq": 1, "ended_at": 1, "counts": [')
            chunk = b"[" + b",".join([b"1"] * 4096) + b"],"
            sent = 0
            while sent < HUGE_BYTES:
                await resp.write(chunk)
                sent += len(chunk)
            await resp.write(b"[1]]}]}")
        elif mode == "slow":
            for byte in b'{"windows": []':
                await resp.write(bytes([byte]))
                await asyncio.sleep(1.0)
        else:
            future = time.time() + 3600
            counts = [[1.0] * experts for _ in range(layers)]
            body = {
                "windows": [{"seq": s, "ended_at": future, "counts": counts} for s in (1, 2)],
                "latest_seq": 2,
            }
            await resp.write(json.dumps(body).encode())
        await resp.write_eof()
        return resp

    async def anything(request: web.Request) -> web.Response:
        await record(request)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/v1/windows", windows)
    app.router.add_route("*", "/{tail:.*}", anything)
    web.run_app(app, host=host, port=port, print=None)


if __name__ == "__main__":
    main()
