"""Request bodies from peers the runtime does not trust: bounded in size, depth and content.

Python's json module takes any depth (a deep enough array raises RecursionError, not
ValueError), NaN and Infinity, and duplicate keys (the last one wins silently). The body is
read with a byte cap before it is parsed at all, its nesting is counted before ``json``
sees it, constants other than true/false/null are refused, and so are duplicate keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

from aiohttp import web

MAX_DEPTH = 8  # a placement document is 3 deep (object > rows > slots)
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class BadBody(Exception):
    """A body refused before it reached any state; ``status`` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read(request: web.Request, max_bytes: int) -> bytes:
    """The raw body, refused (413) as soon as it exceeds ``max_bytes``; never decompressed."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise BadBody(415, f"Content-Encoding {encoding!r} is not accepted; send the body uncompressed")
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise BadBody(413, f"body of {declared} bytes exceeds the limit of {max_bytes} bytes")
    body = bytearray()
    while chunk := await request.content.read(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            raise BadBody(413, f"body exceeds the limit of {max_bytes} bytes")
    return bytes(body)


def depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects, counted outside strings."""
    level = deepest = 0
    for m in _TOKENS.finditer(raw):
        c = m.group()[:1]
        if c in (b"[", b"{"):
            level += 1
            deepest = max(deepest, level)
        elif c in (b"]", b"}"):
            level -= 1
    return deepest


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:64]!r}")
        out[key] = value
    return out


def loads(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """JSON, refused (BadBody 400) when not UTF-8, deeper than ``max_depth``, NaN/Infinity or duplicate keys."""
    if not raw.strip():
        raise BadBody(400, "body must be a JSON document (got an empty body)")
    deep = depth(raw)
    if deep > max_depth:
        raise BadBody(400, f"JSON nested {deep} levels deep; at most {max_depth} are accepted")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_constant, object_pairs_hook=_object)
    except UnicodeDecodeError as exc:
        raise BadBody(400, "body must be UTF-8 JSON") from exc
    except (ValueError, RecursionError) as exc:
        raise BadBody(400, f"body is not valid JSON: {str(exc)[:200]}") from exc


def only_fields(doc: Any, allowed: Collection[str], what: str) -> dict[str, Any]:
    """A JSON object with no field outside ``allowed`` (unknown fields are refused, not ignored)."""
    if not isinstance(doc, dict):
        raise BadBody(400, f"{what} must be a JSON object")
    unknown = sorted(k for k in doc if k not in allowed)
    if unknown:
        shown = ", ".join(repr(k[:64]) for k in unknown[:5])
        raise BadBody(400, f"{what}: unknown field(s) {shown}; allowed: {', '.join(sorted(allowed))}")
    return doc
