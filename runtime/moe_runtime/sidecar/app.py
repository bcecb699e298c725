"""HTTP apps of the sidecar (aiohttp), one per listener (moe_contract.pod: "the runtime's three
listeners"):

API (port ``runtime``, every route needs ``Authorization: Bearer <token>``)
  GET  /v1/status               identity, engine state and start-up phase ("start": null when
                                this runtime does not read the engine's output), layout,
                                placement, plugin counters, load source
  GET  /v1/windows?after=&limit=&counts=&steps=   recent load windows, oldest first (steps:
                                the newest window's step samples, when it has them); JSON, or
                                the binary encoding of moe_contract.windows_wire when the
                                request's Accept names its media type (the operator's does)
  GET  /v1/windows/latest?steps=   the newest window
  GET  /v1/placement            the held operator placement and the applied map's origin
  PUT  /v1/placement            push {version, physicalToLogicalMap, generatedAt?} (POST too)
  PUT  /v1/plan                 plan this instance: a moe_contract.plan_wire request (binary,
                                at most plan_wire.MAX_REQUEST_BYTES, its own cap); 202 queued,
                                400 malformed, 413 too large, 415 wrong media type, 422 a
                                shape this runtime's engine does not have (planning.py)
  GET  /v1/plan?request=        the proposal of a request (default: the newest one):
                                {request, state, seconds, message, physical_to_logical_map,
                                newest_seq}; the operator checks and scores the map itself
Probes (port ``probes``, no token): GET /healthz (the event loop runs), GET /readyz (the engine
  rank of this pod answers its health check and the pod is not draining)
Metrics (port ``metrics``, no token): GET /metrics

The API listener serves /v1/* only: the operator's pod template probes the probe port and its
PodMonitors scrape the metrics port. Only the replay engine's ``--reads open`` (tests that read
without a token) leaves the API's GET routes open (``open_reads``); `launch` never does. Writes
(PUT /v1/placement, PUT /v1/plan) need the token always.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from moe_contract import plan_wire, windows_wire
from moe_runtime import __version__
from moe_runtime.sidecar import bodies
from moe_runtime.sidecar.auth import TokenFile
from moe_runtime.sidecar.listener import Limits, one_request_per_connection
from moe_runtime.sidecar.metrics import RuntimeMetrics
from moe_runtime.sidecar.planning import PlanWorker, layout_mismatch
from moe_runtime.sidecar.state import PushRejected, SidecarState

MAX_BODY = Limits().max_body
# The placement document's fields (moe_placement.document); anything else is refused.
PLACEMENT_FIELDS = frozenset(
    {"version", "generatedAt", "generated_at", "physicalToLogicalMap", "physical_to_logical_map", "source"}
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Identity:
    """Who this runtime is (instance, role, engine), echoed by /v1/status."""

    data: dict[str, Any]


@dataclass(frozen=True)
class ApiPolicy:
    open_reads: bool = False  # GET routes without a token (replay --reads open)
    max_body: int = MAX_BODY


STATE_KEY = web.AppKey("state", SidecarState)
METRICS_KEY = web.AppKey("metrics", RuntimeMetrics)
TOKEN_KEY = web.AppKey("token", TokenFile)
IDENTITY_KEY = web.AppKey("identity", Identity)
POLICY_KEY = web.AppKey("policy", ApiPolicy)
EXTRA_STATUS_KEY = web.AppKey("extra_status", dict[str, Any])
PLANS_KEY = web.AppKey("plans", PlanWorker)


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(doc), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def check_token(request: web.Request) -> web.Response | None:
    """None when the request carries the current token, else the 401/503 answer to give."""
    allowed, why = request.app[TOKEN_KEY].check(request.headers.get("Authorization"))
    if allowed:
        return None
    resp = _error(503 if why.startswith("writes are disabled") else 401, why)
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every API route needs the token (the replay engine's test mode may open reads)."""
    policy = request.app[POLICY_KEY]
    if policy.open_reads and request.method in ("GET", "HEAD"):
        return await handler(request)
    refused = check_token(request)
    if refused is not None:
        m = request.app[METRICS_KEY]
        m.refused.labels("unauthorized").inc()
        if request.path == "/v1/placement" and request.method in ("PUT", "POST"):
            m.pushes.labels("unauthorized").inc()
        return refused
    return await handler(request)


async def read_json(
    request: web.Request, fields: frozenset[str], what: str, *, empty: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The body as a JSON object of known fields (``empty`` for no body, when given); raises
    bodies.BadBody (counted)."""
    try:
        raw = await bodies.read(request, request.app[POLICY_KEY].max_body)
        if empty is not None and not raw.strip():
            return dict(empty)
        return bodies.only_fields(bodies.loads(raw), fields, what)
    except bodies.BadBody as exc:
        request.app[METRICS_KEY].refused.labels("too_large" if exc.status == 413 else "bad_body").inc()
        raise


# ---------------------------------------------------------------- probes and metrics


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


# ---------------------------------------------------------------- API


async def status(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    lay = s.layout
    latest = s.windows[-1] if s.windows else None
    identity = request.app[IDENTITY_KEY]
    extra = request.app[EXTRA_STATUS_KEY]
    return _json(
        {
            **identity.data,
            "version": __version__,
            "engine": {"ready": s.engine_ready, "reason": s.engine_reason, "draining": s.draining},
            "start": s.start_status(),
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
            **extra,
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


def _cursor(raw: str, name: str, low: int, high: int) -> int:
    if len(raw) > 20:
        raise ValueError(name)
    value = int(raw)
    if not low <= value <= high:
        raise ValueError(name)
    return value


async def windows(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    try:
        after = _cursor(request.query.get("after", "0"), "after", 0, 2**62)
        limit = _cursor(request.query.get("limit", str(s.ring_size)), "limit", 1, 2**62)
    except ValueError:
        return _error(400, f"after must be an integer >= 0 and limit one in [1, {s.ring_size}]")
    limit = min(limit, s.ring_size)
    with_counts = _flag(request, "counts", True)
    with_steps = _flag(request, "steps", False)
    items = s.windows_after(after, limit)
    if windows_wire.accepts(request.headers.get("Accept")):
        wire = [w.to_wire(steps=with_steps) for w in items]
        body = windows_wire.encode(wire, s.seq, time.time(), with_counts=with_counts)
        return web.Response(body=body, content_type=windows_wire.MEDIA_TYPE, headers={"Vary": "Accept"})
    top_k = s.layout.top_k
    resp = _json(
        {
            "windows": [w.to_json(top_k, counts=with_counts, steps=with_steps) for w in items],
            "latest_seq": s.seq,
            "now": time.time(),
        }
    )
    resp.headers["Vary"] = "Accept"  # the same URL answers binary to who asks for it
    return resp


async def latest_window(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    if not s.windows:
        return _error(404, "no window yet")
    return _json(s.windows[-1].to_json(s.layout.top_k, steps=_flag(request, "steps", False)))


def _flag(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    return default if raw is None else raw.lower() not in ("0", "false", "no")


async def get_placement(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    doc = _placement_summary(s)
    if s.pushed is not None:
        doc["physical_to_logical_map"] = s.pushed.physical_to_logical_map.tolist()
    return _json(doc)


async def put_placement(request: web.Request) -> web.Response:
    m = request.app[METRICS_KEY]
    try:
        body = await read_json(request, PLACEMENT_FIELDS, "placement")
    except bodies.BadBody as exc:
        m.pushes.labels("rejected").inc()
        return _error(exc.status, str(exc))
    try:
        outcome, doc = request.app[STATE_KEY].push(body)
    except PushRejected as exc:
        m.pushes.labels("rejected").inc()
        return _error(exc.status, str(exc))
    m.pushes.labels(outcome).inc()
    return _json({"result": outcome, "version": doc.version, "generated_at": doc.generated_at})


async def read_plan(request: web.Request) -> plan_wire.PlanRequest:
    """The body as a plan request, read under the route's own cap (a DeepSeek-V3 request is
    1-4 MB, past the 1 MiB of placements); raises bodies.BadBody (counted)."""
    m = request.app[METRICS_KEY]
    try:
        if request.headers.get("Content-Type") and request.content_type != plan_wire.MEDIA_TYPE:
            raise bodies.BadBody(415, f"Content-Type must be {plan_wire.MEDIA_TYPE}")
        raw = await bodies.read(request, plan_wire.MAX_REQUEST_BYTES)
        try:
            return plan_wire.decode(raw)
        except windows_wire.WireError as exc:
            raise bodies.BadBody(400, f"not a plan request: {exc}") from exc
    except bodies.BadBody as exc:
        m.refused.labels("too_large" if exc.status == 413 else "bad_body").inc()
        m.plans.labels("rejected").inc()
        raise


async def put_plan(request: web.Request) -> web.Response:
    try:
        req = await read_plan(request)
    except bodies.BadBody as exc:
        return _error(exc.status, str(exc))
    mismatch = layout_mismatch(req, request.app[STATE_KEY].layout)
    if mismatch is not None:
        request.app[METRICS_KEY].plans.labels("rejected").inc()
        return _error(422, mismatch)
    proposal = request.app[PLANS_KEY].submit(req)
    return _json({"request": proposal["request"], "state": proposal["state"]}, 202)


async def get_plan(request: web.Request) -> web.Response:
    name = request.query.get("request")
    if name is not None and not plan_wire.REQUEST_ID.fullmatch(name):
        return _error(400, "request is not an id of 1-128 letters, digits and ._:-")
    proposal = request.app[PLANS_KEY].proposal(name)
    if proposal is None:
        return _error(404, f"no proposal kept for request {name}")
    return _json(proposal)


async def _close_plans(app: web.Application) -> None:
    app[PLANS_KEY].close()


# ---------------------------------------------------------------- the three apps


def _app(*middlewares: Any) -> web.Application:
    # client_max_size backs up bodies.read's own cap (aiohttp's request.read/json)
    return web.Application(client_max_size=MAX_BODY, middlewares=[one_request_per_connection, *middlewares])


def api_app(
    state: SidecarState,
    metrics_: RuntimeMetrics,
    token: TokenFile,
    identity: dict[str, Any],
    policy: ApiPolicy | None = None,
) -> web.Application:
    app = _app(require_token)
    app[STATE_KEY] = state
    app[METRICS_KEY] = metrics_
    app[TOKEN_KEY] = token
    app[IDENTITY_KEY] = Identity(identity)
    app[POLICY_KEY] = policy or ApiPolicy()
    app[EXTRA_STATUS_KEY] = {}
    app[PLANS_KEY] = PlanWorker(state, metrics_)
    app.on_cleanup.append(_close_plans)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/windows", windows)
    app.router.add_get("/v1/windows/latest", latest_window)
    app.router.add_get("/v1/placement", get_placement)
    app.router.add_put("/v1/placement", put_placement)
    app.router.add_post("/v1/placement", put_placement)
    app.router.add_put("/v1/plan", put_plan)
    app.router.add_get("/v1/plan", get_plan)
    return app


def probe_app(state: SidecarState) -> web.Application:
    app = _app()
    app[STATE_KEY] = state
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app(metrics_: RuntimeMetrics) -> web.Application:
    app = _app()
    app[METRICS_KEY] = metrics_
    app.router.add_get("/metrics", metrics)
    return app
