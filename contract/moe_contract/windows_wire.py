"""The binary encoding of a ``GET /v1/windows`` answer, defined once: the runtime encodes, the
operator decodes (runtime/README.md, "Load windows on the wire").

At DeepSeek-V3 shapes one JSON answer is megabytes of decimal text per leader per poll, and
``json.loads`` plus the conversion to arrays is most of the operator's CPU per refresh; here the
arrays travel as raw little-endian numbers and decode as views of the body. The runtime answers
this encoding only to a request whose ``Accept`` names MEDIA_TYPE; JSON stays the default.

Layout (all little-endian)::

    magic  b"MOEW"            4 bytes
    version                   uint16 (VERSION)
    header length             uint32 (at most MAX_HEADER_BYTES)
    header                    UTF-8 JSON object:
        {"latest_seq": int, "now": float, "windows": [
            {"seq": int, "started_at": float, "ended_at": float, "passes": int,
             "shape": [layers, experts], "counts": dtype or null, "steps": k, "steps_dtype": dtype or null},
            ...]}                                              (at most MAX_WINDOWS windows)
    per window, in header order: counts [layers, experts] (absent when its dtype is null), then
        steps [k, layers, experts] (absent when k is 0)
    nothing after the last array

A dtype is one of DTYPES; the encoder picks, per array, the narrowest one that holds every value
exactly (per-pass samples are uint16 at today's batch sizes, window sums uint32), so no value is
rounded on the wire. The cursor semantics are JSON's: the answer holds the windows after the
request's ``after`` (the delta since the operator's last seq), and ``latest_seq`` tells a restarted
runtime (numbering from 1 again) from one with nothing new.

``decode`` checks the structure only (a malformed answer raises WireError) and gives the same
dictionary as ``json.loads`` of the JSON answer, with arrays for ``counts`` and ``steps``: the
values (numbers, shapes, finiteness, sign) are judged by the reader's one set of rules for both
encodings (moe_operator.control.windows.parse_windows).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

MEDIA_TYPE: Final = "application/vnd.moe-inference.windows.v1"
ACCEPT: Final = f"{MEDIA_TYPE}, application/json;q=0.5"  # what the operator asks with
MAGIC: Final = b"MOEW"
VERSION: Final = 1
PREFIX: Final = struct.Struct("<4sHI")  # magic, version, header length
MAX_HEADER_BYTES: Final = 256 * 1024  # MAX_WINDOWS entries of < 200 bytes each
MAX_WINDOWS: Final = 1024  # the runtime's ring holds 64; the rest of a longer answer comes next poll
MAX_DIM: Final = 65536  # any one dimension (layers, experts, step samples)
MAX_BODY_BYTES: Final = 64 * 2**20  # the operator reads no more of an answer (control/client.py)
DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "u2": np.dtype("<u2"),
    "u4": np.dtype("<u4"),
    "u8": np.dtype("<u8"),
    "f8": np.dtype("<f8"),
}
_UNSIGNED: Final = ("u2", "u4", "u8")  # narrowest first
_ENTRY_BYTES: Final = 200  # a window's header entry at most (numbers of 20-odd digits), to size an answer


class WireError(ValueError):
    """An answer that is not this encoding, or not a whole one; the message is safe for status
    (it names numbers of ours, never the peer's text)."""


@dataclass(frozen=True)
class WireWindow:
    """One window as the runtime holds it: counts [layers, experts] and, on the newest window
    only, up to 32 single-pass samples [k, layers, experts] (any numeric dtype)."""

    seq: int
    started_at: float
    ended_at: float
    passes: int
    counts: npt.NDArray[Any]
    steps: npt.NDArray[Any] | None = None


def wire_dtype(values: npt.NDArray[Any]) -> str:
    """The narrowest dtype of DTYPES that holds every value exactly: non-negative integers by
    their largest, anything else (floats, negatives) as float64."""
    if values.dtype.kind not in "ui":
        return "f8"
    if not values.size:
        return _UNSIGNED[0]
    if int(values.min()) < 0:
        return "f8"
    top = int(values.max())
    return next(name for name in _UNSIGNED if top <= np.iinfo(DTYPES[name]).max)


def encode(
    windows: Sequence[WireWindow],
    latest_seq: int,
    now: float,
    *,
    with_counts: bool = True,
    max_bytes: int = MAX_BODY_BYTES,
) -> bytes:
    """An answer holding ``windows`` (oldest first) up to MAX_WINDOWS and ``max_bytes``: the newest
    ones past either bound are left for the next poll (the reader's cursor stays on the last one
    it got), though the first window always goes. Steps that are not samples of their window's
    shape are left out (the reader would drop them)."""
    entries: list[dict[str, Any]] = []
    arrays: list[bytes] = []
    size = PREFIX.size + _ENTRY_BYTES  # the prefix and the header's own fields
    for w in windows[:MAX_WINDOWS]:
        entry, parts = _window(w, with_counts)
        grown = size + _ENTRY_BYTES + sum(len(p) for p in parts)
        if entries and grown > max_bytes:
            break
        entries.append(entry)
        arrays += parts
        size = grown
    header = json.dumps(
        {"latest_seq": latest_seq, "now": now, "windows": entries}, separators=(",", ":")
    ).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"a header of {len(header)} bytes (at most {MAX_HEADER_BYTES})")
    return b"".join([PREFIX.pack(MAGIC, VERSION, len(header)), header, *arrays])


def _window(w: WireWindow, with_counts: bool) -> tuple[dict[str, Any], list[bytes]]:
    """One window's header entry and its arrays' bytes."""
    counts = np.asarray(w.counts)
    shape = [int(n) for n in counts.shape]
    entry: dict[str, Any] = {
        "seq": w.seq,
        "started_at": w.started_at,
        "ended_at": w.ended_at,
        "passes": w.passes,
        "shape": shape,
        "counts": None,
        "steps": 0,
        "steps_dtype": None,
    }
    parts: list[bytes] = []
    if with_counts:
        entry["counts"] = wire_dtype(counts)
        parts.append(_bytes(counts, entry["counts"]))
    steps = None if w.steps is None else np.asarray(w.steps)
    if steps is not None and steps.ndim == 3 and list(steps.shape[1:]) == shape and len(steps) > 0:
        entry["steps"], entry["steps_dtype"] = len(steps), wire_dtype(steps)
        parts.append(_bytes(steps, entry["steps_dtype"]))
    return entry, parts


def _bytes(values: npt.NDArray[Any], dtype: str) -> bytes:
    return np.ascontiguousarray(values, dtype=DTYPES[dtype]).tobytes()


def decode(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The answer as ``json.loads`` would give its JSON twin: ``{"windows": [{"seq", "started_at",
    "ended_at", "passes", "counts"?, "steps"?}], "latest_seq", "now"}``, arrays as read-only views
    of ``body`` (copy what you keep). Raises WireError unless ``body`` is exactly one answer:
    every size a header declares is checked against the bytes present before it is used, so a
    header's claims allocate nothing."""
    buf = memoryview(body).cast("B").toreadonly()
    if len(buf) < PREFIX.size:
        raise WireError(f"{len(buf)} bytes, shorter than the {PREFIX.size}-byte prefix")
    magic, version, header_len = PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise WireError("not a windows encoding (no magic)")
    if version != VERSION:
        raise WireError(f"encoding version {version}, this side reads {VERSION}")
    if header_len > MAX_HEADER_BYTES or PREFIX.size + header_len > len(buf):
        raise WireError(f"a header of {header_len} bytes in {len(buf)} (at most {MAX_HEADER_BYTES})")
    offset = PREFIX.size + header_len
    try:
        header = json.loads(bytes(buf[PREFIX.size : offset]))
    except (ValueError, RecursionError) as exc:
        raise WireError("the header is not JSON") from exc
    entries = header.get("windows") if isinstance(header, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_WINDOWS:
        raise WireError(f"the header holds no list of at most {MAX_WINDOWS} windows")
    windows: list[dict[str, Any]] = []
    for entry in entries:
        doc, offset = _read_window(buf, offset, entry)
        windows.append(doc)
    if offset != len(buf):
        raise WireError(f"{len(buf) - offset} bytes past the last array")
    return {"windows": windows, "latest_seq": header.get("latest_seq"), "now": header.get("now")}


def _read_window(buf: memoryview, offset: int, entry: Any) -> tuple[dict[str, Any], int]:
    """One window's fields (seq and times as the header gives them: the reader judges them) and
    its arrays, and where the next window's arrays start."""
    if not isinstance(entry, dict):
        raise WireError("a window entry is not an object")
    shape = entry.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(_dim(n) for n in shape)):
        raise WireError(f"a window's shape is not two integers in [0, {MAX_DIM}]")
    doc = {k: entry.get(k) for k in ("seq", "started_at", "ended_at", "passes")}
    if entry.get("counts") is not None:
        doc["counts"], offset = read_array(buf, offset, entry["counts"], (shape[0], shape[1]))
    k = entry.get("steps", 0)
    if not _dim(k):
        raise WireError(f"a window's step count is not an integer in [0, {MAX_DIM}]")
    if k:
        doc["steps"], offset = read_array(buf, offset, entry.get("steps_dtype"), (k, shape[0], shape[1]))
    return doc, offset


def _dim(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_DIM


def read_array(
    buf: memoryview, offset: int, dtype_name: Any, shape: tuple[int, ...]
) -> tuple[npt.NDArray[Any], int]:
    """The array at ``offset`` (a view), once its declared size is known to be there."""
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise WireError(f"an array's dtype is not one of {sorted(DTYPES)}")
    count = math.prod(shape)
    size = count * dtype.itemsize
    if size > len(buf) - offset:
        raise WireError(f"an array of {size} bytes at {offset} runs past the answer's {len(buf)}")
    values = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
    return values, offset + size


def accepts(accept: str | None) -> bool:
    """Whether a request's Accept header asks for this encoding (listed, at a q above 0)."""
    for item in (accept or "").split(",")[:32]:
        kind, *params = (p.strip().lower() for p in item.split(";"))
        if kind == MEDIA_TYPE and _quality(params) > 0:
            return True
    return False


def _quality(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def is_encoded(content_type: str | None) -> bool:
    """Whether an answer's Content-Type says it is this encoding (else it is JSON)."""
    return (content_type or "").split(";", 1)[0].strip().lower() == MEDIA_TYPE
