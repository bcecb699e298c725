"""A bounded, compact copy of a pool's load history, kept in a ConfigMap across operator restarts.

Why: the history (spec.eplb.history, up to hours of windows) lives in the operator's memory; a
restarted operator would otherwise plan from the few windows the runtimes still hold. What is
kept is exactly what the planner consumes: the time buckets of aggregated counts [T, L, E], plus
the per-instance window cursors (so windows already counted are not fetched and counted twice).

Counts are stored per bucket and layer as uint16 fractions of that row's maximum (relative error
below 1e-4 of the hottest expert, far under the Poisson noise of a window), zlib-compressed and
base64-encoded. Oldest buckets are dropped until the document fits ``max_bytes``: ConfigMaps are
limited to 1 MiB, and DeepSeek-V3 (61 x 256) needs about 30 KiB per bucket before compression.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_operator.control import aggregate
from moe_operator.control.windows import FloatArray, Window

FORMAT = 1
KEY = "history.json"
MAX_BYTES = 640 * 1024
_SCALE = 65535.0


@dataclass(frozen=True)
class Snapshot:
    """Time buckets (key = bucket start // bucket_s), oldest first, and window cursors per instance."""

    bucket_s: float
    keys: list[int]
    counts: FloatArray  # [T, L, E]
    cursors: dict[str, int]
    saved_at: float


def _pack(counts: FloatArray) -> tuple[str, list[list[float]]]:
    peak = counts.max(axis=-1)  # [T, L]
    safe = np.where(peak > 0, peak, 1.0)[..., None]
    q = np.rint(counts / safe * _SCALE).astype("<u2")
    blob = base64.b64encode(zlib.compress(q.tobytes(), 6)).decode()
    return blob, peak.tolist()


def encode(snap: Snapshot, max_bytes: int = MAX_BYTES) -> str:
    """The ConfigMap value; drops the oldest buckets until it fits (raises if not even one does)."""
    keys, counts = list(snap.keys), snap.counts
    if counts.ndim != 3 or len(keys) != counts.shape[0]:
        raise ValueError(f"{len(keys)} keys for counts of shape {list(counts.shape)}")
    while True:
        blob, peak = _pack(counts)
        doc = {
            "format": FORMAT,
            "bucketSeconds": snap.bucket_s,
            "savedAt": round(snap.saved_at, 3),
            "shape": list(counts.shape),
            "keys": keys,
            "peak": peak,
            "counts": blob,
            "cursors": snap.cursors,
        }
        text = json.dumps(doc, separators=(",", ":"))
        if len(text) <= max_bytes:
            return text
        if len(keys) <= 1:
            raise ValueError(f"one bucket of load history needs {len(text)} bytes > {max_bytes}")
        # proportional to the excess, at least one, never the newest
        drop = min(len(keys) - 1, max(1, len(keys) - int(len(keys) * max_bytes / len(text))))
        keys, counts = keys[drop:], counts[drop:]


def decode(text: str, shape: tuple[int, int]) -> Snapshot | None:
    """The stored snapshot, or None when it is missing, foreign or of another model shape."""
    try:
        doc: dict[str, Any] = json.loads(text)
        if doc.get("format") != FORMAT:
            return None
        t, layers, experts = (int(x) for x in doc["shape"])
        if (layers, experts) != shape or t != len(doc["keys"]):
            return None
        raw = zlib.decompress(base64.b64decode(doc["counts"]))
        q = np.frombuffer(raw, dtype="<u2").reshape(t, layers, experts).astype(np.float64)
        peak = np.asarray(doc["peak"], dtype=np.float64).reshape(t, layers)
        counts = q / _SCALE * peak[..., None]
        cursors = {str(k): int(v) for k, v in dict(doc.get("cursors") or {}).items()}
        return Snapshot(
            float(doc["bucketSeconds"]),
            [int(k) for k in doc["keys"]],
            counts,
            cursors,
            float(doc.get("savedAt") or 0.0),
        )
    except (ValueError, KeyError, TypeError, zlib.error):
        return None


def snapshot(
    windows: Sequence[Window], bucket_s: float, cursors: dict[str, int], now: float
) -> Snapshot | None:
    """What to store: the planner's own buckets of this history (None when it is empty)."""
    if not windows:
        return None
    keys, counts = aggregate.bucketed(windows, bucket_s)
    return Snapshot(bucket_s, keys, counts, dict(cursors), now)


def restored_windows(snap: Snapshot) -> list[Window]:
    """The buckets as windows ending mid-bucket (so a changed bucket size still sorts them in)."""
    return [
        Window("restored", key, (key + 0.5) * snap.bucket_s, snap.counts[i], restored=True)
        for i, key in enumerate(snap.keys)
    ]
