"""A plan request: what the operator sends a runtime so that it plans its own instance
(``PUT /v1/plan``; docs/scale.md, "Where planning runs").

Planning is the control loop's whole cost at fleet scale, and each runtime already holds its
own instance's windows and the planner. The operator sends what only it knows: the pool's
history on the operator's time buckets (the prior), the buckets themselves (so the runtime sums
its own windows on the same keys), the map it believes the instance runs, the pool's shape and
the move cap. The runtime answers a proposal (``GET /v1/plan``, JSON); the operator trusts
nothing in it but the map, which it checks and scores itself.

Layout (little-endian), as moe_contract.windows_wire::

    magic b"MOEP" | version uint16 | header length uint32 | header (UTF-8 JSON) |
    prior [buckets, layers, experts] float64 | current [layers, slots] uint16

``decode`` checks everything a runtime relies on before it plans: sizes against the bytes present
(nothing allocated on a header's word), shapes against each other, numbers in range, the prior
finite and non-negative, the map's entries inside the expert count. What only the runtime knows
(its model's shape) it checks itself.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

import numpy as np
import numpy.typing as npt

from moe_contract.windows_wire import MAX_DIM, WireError, read_array

MEDIA_TYPE: Final = "application/vnd.moe-inference.plan.v1"
MAGIC: Final = b"MOEP"
VERSION: Final = 1
PREFIX: Final = struct.Struct("<4sHI")
MAX_HEADER_BYTES: Final = 64 * 1024
MAX_BUCKETS: Final = 64  # the operator plans on at most 32 (moe_operator.control.aggregate.MAX_BUCKETS)
MAX_REQUEST_BYTES: Final = 16 * 2**20  # 32 buckets of DeepSeek-V3 windows are 4 MB (8 buckets: 1 MB)
DISPATCH: Final = ("static", "dynamic")
REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")


@dataclass(frozen=True)
class PlanRequest:
    """One instance's planning inputs that only the operator holds."""

    request: str  # the operator's id for it; the proposal names it back
    bucket_s: float  # the operator's time buckets: a window ending at t sums into int(t // bucket_s)
    keys: tuple[int, ...]  # the pool's buckets, oldest first (the prior's rows)
    fresh_after: float  # the newest window must end after this, or there is nothing to plan
    num_gpus: int
    num_nodes: int
    num_redundant: int
    num_groups: int
    dispatch: str
    max_moves: int | None  # expert copies the plan may move (None: no cap)
    prior: npt.NDArray[np.float64]  # [buckets, layers, experts]
    current: npt.NDArray[np.int64]  # [layers, experts + redundant]


def encode(r: PlanRequest) -> bytes:
    header = {
        "request": r.request,
        "bucket_s": r.bucket_s,
        "keys": list(r.keys),
        "fresh_after": r.fresh_after,
        "num_gpus": r.num_gpus,
        "num_nodes": r.num_nodes,
        "num_redundant": r.num_redundant,
        "num_groups": r.num_groups,
        "dispatch": r.dispatch,
        "max_moves": r.max_moves,
        "shape": list(r.prior.shape[1:]),
        "slots": int(r.current.shape[1]),
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    prior = np.ascontiguousarray(r.prior, dtype="<f8").tobytes()
    current = np.ascontiguousarray(r.current, dtype="<u2").tobytes()
    return b"".join([PREFIX.pack(MAGIC, VERSION, len(text)), text, prior, current])


def decode(body: bytes | bytearray | memoryview) -> PlanRequest:
    """The request in ``body``, or WireError naming what is wrong (a message safe to log)."""
    buf = memoryview(body).cast("B").toreadonly()
    if len(buf) > MAX_REQUEST_BYTES:
        raise WireError(f"a request of {len(buf)} bytes (at most {MAX_REQUEST_BYTES})")
    if len(buf) < PREFIX.size:
        raise WireError(f"{len(buf)} bytes, shorter than the {PREFIX.size}-byte prefix")
    magic, version, header_len = PREFIX.unpack_from(buf)
    if magic != MAGIC or version != VERSION:
        raise WireError(f"not a plan request of version {VERSION}")
    if header_len > MAX_HEADER_BYTES or PREFIX.size + header_len > len(buf):
        raise WireError(f"a header of {header_len} bytes in {len(buf)} (at most {MAX_HEADER_BYTES})")
    try:
        h = json.loads(bytes(buf[PREFIX.size : PREFIX.size + header_len]))
    except (ValueError, RecursionError) as exc:
        raise WireError("the header is not JSON") from exc
    if not isinstance(h, dict):
        raise WireError("the header is not an object")
    fields = _fields(h)
    layers, experts = fields.pop("shape")
    slots = fields.pop("slots")
    offset = PREFIX.size + header_len
    prior, offset = read_array(buf, offset, "f8", (len(fields["keys"]), layers, experts))
    current, offset = read_array(buf, offset, "u2", (layers, slots))
    if offset != len(buf):
        raise WireError(f"{len(buf) - offset} bytes past the last array")
    if not np.all(np.isfinite(prior)) or prior.min(initial=0.0) < 0:
        raise WireError("the prior is not finite and non-negative")
    if current.size and int(current.max()) >= experts:
        raise WireError(f"the current map names experts outside [0, {experts})")
    return PlanRequest(**fields, prior=np.array(prior), current=np.array(current, dtype=np.int64))


def _fields(h: dict[str, Any]) -> dict[str, Any]:
    """The header's fields, each checked for type and range."""
    request = h.get("request")
    if not isinstance(request, str) or not REQUEST_ID.fullmatch(request):
        raise WireError("request is not an id of 1-128 letters, digits and ._:-")
    keys = h.get("keys")
    if (
        not isinstance(keys, list)
        or not 0 < len(keys) <= MAX_BUCKETS
        or not all(_int(k, 2**53) for k in keys)
    ):
        raise WireError(f"keys are not 1-{MAX_BUCKETS} bucket numbers")
    if any(b <= a for a, b in itertools.pairwise(keys)):
        raise WireError("keys are not increasing")
    bucket_s, fresh_after = h.get("bucket_s"), h.get("fresh_after")
    if not _number(bucket_s) or not 0 < bucket_s <= 86400:
        raise WireError("bucket_s is not a number of seconds in (0, 86400]")
    if not _number(fresh_after):
        raise WireError("fresh_after is not a time")
    shape, slots = h.get("shape"), h.get("slots")
    if not (isinstance(shape, list) and len(shape) == 2 and all(_int(n, MAX_DIM) and n > 0 for n in shape)):
        raise WireError(f"shape is not [layers, experts] in [1, {MAX_DIM}]")
    if not _int(slots, MAX_DIM) or slots < shape[1]:
        raise WireError("slots is not a count at least the experts'")
    ints: dict[str, Any] = {k: h.get(k) for k in ("num_gpus", "num_nodes", "num_redundant", "num_groups")}
    if not all(_int(v, MAX_DIM) for v in ints.values()) or ints["num_gpus"] < 1 or ints["num_nodes"] < 1:
        raise WireError("num_gpus, num_nodes, num_redundant and num_groups are not counts")
    if ints["num_groups"] < 1 or slots != shape[1] + ints["num_redundant"] or slots % ints["num_gpus"]:
        raise WireError("slots are not experts + redundant, spread evenly over the GPUs")
    max_moves = h.get("max_moves")
    if max_moves is not None and not _int(max_moves, 2**31):
        raise WireError("max_moves is not a count (or null)")
    if h.get("dispatch") not in DISPATCH:
        raise WireError(f"dispatch is not one of {DISPATCH}")
    return {
        "request": request, "bucket_s": float(bucket_s), "keys": tuple(keys), "fresh_after": float(fresh_after),
        **ints, "dispatch": h["dispatch"], "max_moves": max_moves, "shape": shape, "slots": slots,
    }  # fmt: skip


def _int(v: Any, top: int) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= top


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
