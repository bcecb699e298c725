"""HTTP API of the sidecar (aiohttp). Reads are open (Prometheus, the operator's collector);
writes need ``Authorization: Bearer <token>``.

GET  /healthz                 the sidecar's loop runs
GET  /readyz                  the engine is healthy and not draining (503 otherwise)
GET  /metrics                 Prometheus text
GET  /v1/status               identity, layout, placement, plugin counters
GET  /v1/windows?after=&limit=&counts=   recent load windows, oldest first
GET  /v1/windows/latest       the newest window
GET  /v1/placement            the held operator placement and the applied map's origin
PUT  /v1/placement            push {version, physical_to_logical_map, generated_at?} (POST too)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from moe_runtime import __version__
from moe_runtime.sidecar.auth import TokenFile
from moe_runtime.sidecar.metrics import RuntimeMetrics
from moe_runtime.sidecar.state import PushRejected, SidecarState

MAX_BODY = 16 * 1024 * 1024  # a 61 x 288 map is ~70 kB of JSON; leave room for larger models


@dataclass(frozen=True)
class Identity:
    """Who this runtime is (instance, role, engine), echoed by /v1/status."""

    data: dict[str, Any]


STATE_KEY = web.AppKey("state", SidecarState)
METRICS_KEY = web.AppKey("metrics", RuntimeMetrics)
TOKEN_KEY = web.AppKey("token", TokenFile)
IDENTITY_KEY = web.AppKey("identity", Identity)


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(doc), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    ready = s.engine_ready and not s.draining
    reason = "draining" if s.draining else s.engine_reason
    return _json({"ready": ready, "reason": reason}, 200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    lay = s.layout
    latest = s.windows[-1] if s.windows else None
    identity = request.app[IDENTITY_KEY]
    return _json(
        {
            **identity.data,
            "version": __version__,
            "engine": {"ready": s.engine_ready, "reason": s.engine_reason, "draining": s.draining},
            "layout": {
                "num_layers": lay.num_layers,
                "num_experts": lay.num_experts,
                "num_redundant": lay.num_redundant,
                "num_gpus": lay.num_gpus,
                "top_k": lay.top_k,
                "dispatch": lay.dispatch,
            },
            "windows": {"count": len(s.windows), "latest_seq": latest.seq if latest else None},
            "placement": _placement_summary(s),
            "plugin": s.plugin_status,
        }
    )


def _placement_summary(s: SidecarState) -> dict[str, Any]:
    pushed = s.pushed
    applied = s.applied
    return {
        "version": pushed.version if pushed else None,
        "generated_at": pushed.generated_at if pushed else None,
        "age_seconds": pushed.age() if pushed else None,
        "applied": (
            {"source": applied.source, "version": applied.version, "applied_at": applied.applied_at}
            if applied
            else {"source": "trivial", "version": None, "applied_at": None}
        ),
    }


async def windows(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    try:
        after = int(request.query.get("after", "0"))
        limit = max(1, min(int(request.query.get("limit", str(s.ring_size))), s.ring_size))
    except ValueError:
        return _error(400, "after and limit must be integers")
    with_counts = request.query.get("counts", "true").lower() not in ("0", "false", "no")
    items = s.windows_after(after, limit)
    top_k = s.layout.top_k
    return _json(
        {
            "windows": [w.to_json(top_k, counts=with_counts) for w in items],
            "latest_seq": s.seq,
            "now": time.time(),
        }
    )


async def latest_window(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    if not s.windows:
        return _error(404, "no window yet")
    return _json(s.windows[-1].to_json(s.layout.top_k))


async def get_placement(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    doc = _placement_summary(s)
    if s.pushed is not None:
        doc["physical_to_logical_map"] = s.pushed.physical_to_logical_map.tolist()
    return _json(doc)


async def put_placement(request: web.Request) -> web.Response:
    m = request.app[METRICS_KEY]
    allowed, why = request.app[TOKEN_KEY].check(request.headers.get("Authorization"))
    if not allowed:
        m.pushes.labels("unauthorized").inc()
        status = 503 if why.startswith("writes are disabled") else 401
        resp = _error(status, why)
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        m.pushes.labels("rejected").inc()
        return _error(400, "body must be JSON")
    try:
        outcome, doc = request.app[STATE_KEY].push(body)
    except PushRejected as exc:
        m.pushes.labels("rejected").inc()
        return _error(exc.status, str(exc))
    m.pushes.labels(outcome).inc()
    return _json({"result": outcome, "version": doc.version, "generated_at": doc.generated_at})


def build_app(
    state: SidecarState, metrics_: RuntimeMetrics, token: TokenFile, identity: dict[str, Any]
) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[STATE_KEY] = state
    app[METRICS_KEY] = metrics_
    app[TOKEN_KEY] = token
    app[IDENTITY_KEY] = Identity(identity)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/windows", windows)
    app.router.add_get("/v1/windows/latest", latest_window)
    app.router.add_get("/v1/placement", get_placement)
    app.router.add_put("/v1/placement", put_placement)
    app.router.add_post("/v1/placement", put_placement)
    return app
