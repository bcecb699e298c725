"""The control loop's HTTP client for engine runtimes: load windows in, placements out.

Runtimes are peers the operator does not trust: every answer is read with a deadline and a
byte cap, and a failure is a short string for status, never an exception that stops a pool.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from moe_contract import plan_wire, windows_wire
from moe_contract.pod import SIDECAR_PORT

TIMEOUT_S = 3.0
MAX_ANSWER_BYTES = windows_wire.MAX_BODY_BYTES  # a ring of 64 V3 windows: up to ~30 MB as JSON, ~5 MB binary
MAX_STATUS_BYTES = 256 * 1024  # identity, counters and the start-up phase: a few kB
MAX_PLACEMENT_BYTES = 2 * 1024 * 1024  # a map is L x (E + R) ints: DeepSeek-V3 ~70 kB of JSON
MAX_METRICS_BYTES = 8 * 1024 * 1024  # SGLang's /metrics: per-rank gauges of a wide instance, a few hundred kB
MAX_REFUSAL_BYTES = 4096  # a refusal's reason, shown in status; the rest is never read
# What a runtime sidecar (or the HTTP server under it) can answer a push with; any other status is
# counted as http_other, so a peer cannot grow the pushes metric by one series per status code.
PUSH_STATUSES = frozenset({400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 500, 502, 503, 504})


class RuntimeAnswerError(Exception):
    """A runtime that did not answer usefully; the message is safe to show in status."""


@dataclass(frozen=True)
class Pushed:
    result: str  # ok, http_<status> or unreachable (a metric label)
    refusal: str | None  # for status, None when the runtime took it


class RuntimeClient:
    """One per evaluation; talks to each leader's sidecar on the pod IP."""

    def __init__(
        self, tokens: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S, port: int = SIDECAR_PORT
    ) -> None:
        # a new connection per request (the runtime closes each anyway), so every exchange has its
        # own socket for its deadline; nothing decoded: a compressed answer is refused, not inflated
        self._http = httpx.Client(
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"Accept-Encoding": "identity"},
        )
        self._tokens = dict(tokens or {})  # pod IP -> its instance's token (moe_contract.auth)
        self._deadline_s = timeout_s
        self._port = port

    def __enter__(self) -> RuntimeClient:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    @property
    def has_token(self) -> bool:
        return bool(self._tokens)

    def _headers(self, ip: str) -> dict[str, str]:
        token = self._tokens.get(ip)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def windows(self, ip: str, after: int) -> dict[str, Any]:
        """GET /v1/windows after a cursor (counts included, and the newest window's step samples),
        asked for in the binary encoding (moe_contract.windows_wire: a tenth of the bytes, no JSON
        to parse) and read as JSON from a runtime that answers JSON (one from before it)."""
        params = {"after": str(after), "counts": "true", "steps": "true"}
        url = f"http://{ip}:{self._port}/v1/windows"
        headers = {**self._headers(ip), "Accept": windows_wire.ACCEPT}
        body, content_type = self._get(url, params, headers, MAX_ANSWER_BYTES)
        if not windows_wire.is_encoded(content_type):
            return _json_object(body)
        try:
            return windows_wire.decode(body)
        except windows_wire.WireError as exc:
            raise RuntimeAnswerError(f"binary answer refused: {exc}") from exc

    def status(self, ip: str) -> dict[str, Any]:
        """GET /v1/status: identity, engine state and start-up phase (small; read under a tight cap)."""
        return self._get_json(ip, "/v1/status", {}, MAX_STATUS_BYTES)

    def placement(self, ip: str) -> dict[str, Any]:
        """GET /v1/placement: the version and map the runtime holds (checked by the caller)."""
        return self._get_json(ip, "/v1/placement", {}, MAX_PLACEMENT_BYTES)

    def engine_metrics(self, ip: str, port: int) -> str:
        """GET SGLang's own /metrics on the engine's HTTP port (no token: SGLang serves it open)."""
        body = self._get_bytes(f"http://{ip}:{port}/metrics", {}, {}, MAX_METRICS_BYTES)
        return body.decode("utf-8", errors="replace")

    def _get_json(self, ip: str, path: str, params: dict[str, str], max_bytes: int) -> dict[str, Any]:
        """A JSON object read under a byte cap and a deadline, else RuntimeAnswerError."""
        url = f"http://{ip}:{self._port}{path}"
        return _json_object(self._get_bytes(url, params, self._headers(ip), max_bytes))

    def _get_bytes(
        self, url: str, params: dict[str, str], headers: dict[str, str], max_bytes: int
    ) -> bytearray:
        """A 200 answer's body read under a byte cap and a deadline, else RuntimeAnswerError."""
        return self._get(url, params, headers, max_bytes)[0]

    def _get(
        self, url: str, params: dict[str, str], headers: dict[str, str], max_bytes: int
    ) -> tuple[bytearray, str]:
        """A 200 answer's body, read under a byte cap and a deadline, and its Content-Type; else
        RuntimeAnswerError."""
        started = time.monotonic()
        try:
            with self._stream("GET", url, params=params, headers=headers) as resp:
                if resp.status_code != 200:
                    raise RuntimeAnswerError(f"HTTP {resp.status_code}")
                body = bytearray()
                cut = self._read(resp, body, max_bytes, started)
                if cut:
                    raise RuntimeAnswerError(cut)
                content_type = resp.headers.get("Content-Type", "")
        except httpx.HTTPError as exc:
            raise RuntimeAnswerError(type(exc).__name__) from exc
        return body, content_type

    def push(self, ip: str, doc: Mapping[str, Any]) -> Pushed:
        """PUT a placement document; the runtime validates it against its engine. Of the answer's
        body only a refusal's first bytes are read, within the deadline."""
        url = f"http://{ip}:{self._port}/v1/placement"
        return self._put(url, (200,), json=dict(doc), headers=self._headers(ip))

    def request_plan(self, ip: str, body: bytes) -> Pushed:
        """PUT a plan request (moe_contract.plan_wire) for the runtime to plan its own instance;
        http_404/http_405: a runtime from before it (the operator plans that instance itself)."""
        url = f"http://{ip}:{self._port}/v1/plan"
        headers = {**self._headers(ip), "Content-Type": plan_wire.MEDIA_TYPE}
        return self._put(url, (200, 202), content=body, headers=headers)

    def _put(self, url: str, accepted: tuple[int, ...], **kwargs: Any) -> Pushed:
        """One bounded PUT: ok on an accepted status, else the status and the start of its reason."""
        started = time.monotonic()
        try:
            with self._stream("PUT", url, **kwargs) as resp:
                status = resp.status_code
                if status in accepted:
                    return Pushed("ok", None)
                reason = self._refusal(resp, started)
        except httpx.HTTPError as exc:
            return Pushed("unreachable", type(exc).__name__)
        result = f"http_{status}" if status in PUSH_STATUSES else "http_other"
        return Pushed(result, f"HTTP {status} {reason[:120]}")

    def proposal(self, ip: str, request: str) -> dict[str, Any]:
        """GET /v1/plan?request=: that request's plan (its id, state, map); checked by the caller."""
        return self._get_json(ip, "/v1/plan", {"request": request}, MAX_PLACEMENT_BYTES)

    def _refusal(self, resp: httpx.Response, started: float) -> str:
        """The first MAX_REFUSAL_BYTES of a refusal, or what arrived of them before the deadline."""
        body = bytearray()
        with contextlib.suppress(httpx.HTTPError):  # the status is the answer; its reason is a courtesy
            self._read(resp, body, MAX_REFUSAL_BYTES, started)
        return body[:MAX_REFUSAL_BYTES].decode(errors="replace")

    @contextlib.contextmanager
    def _stream(self, method: str, url: str, **kw: Any) -> Iterator[httpx.Response]:
        """One exchange under a wall-clock deadline of 4 x the timeout, headers included: httpx's
        timeouts are per socket read, so a peer trickling a header byte (or a 100 Continue) every
        few seconds would hold the loop for hours; at the deadline the socket is shut down."""
        deadline = _Deadline(4 * self._deadline_s)
        try:
            with self._http.stream(method, url, extensions={"trace": deadline.trace}, **kw) as resp:
                if resp.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
                    raise httpx.DecodingError("a compressed answer (the operator asks for identity)")
                yield resp
        finally:
            deadline.cancel()

    def _read(self, resp: httpx.Response, body: bytearray, max_bytes: int, started: float) -> str | None:
        """Append the answer's body to ``body``; stop early past ``max_bytes`` or the deadline and
        say which (None: the whole body arrived in time)."""
        for chunk in resp.iter_raw():
            body += chunk
            if len(body) > max_bytes:
                return f"answer larger than {max_bytes} bytes"
            if time.monotonic() - started > 4 * self._deadline_s:
                return f"answer took longer than {4 * self._deadline_s:.0f}s"
        return None


class _Deadline:
    """Shuts an exchange's socket down when its time is up (armed once the connection exists)."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds
        self._timer: threading.Timer | None = None

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                self._timer = threading.Timer(max(0.0, self._end - time.monotonic()), _shut, (sock,))
                self._timer.daemon = True
                self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: the exchange ended on its own
        sock.shutdown(socket.SHUT_RDWR)


def _json_object(body: bytearray) -> dict[str, Any]:
    """The body as a JSON object, else RuntimeAnswerError."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise RuntimeAnswerError("answer is not JSON") from exc
    if not isinstance(answer, dict):
        raise RuntimeAnswerError("answer is not a JSON object")
    return answer
