"""The placement document: one JSON shape for the ConfigMap file, the push body and the plugin's input.

``{"version": 7, "generatedAt": "2026-12-01T12:00:00Z", "physicalToLogicalMap": [[...], ...]}``
(the operator writes camelCase; snake_case keys and unix-second times are accepted too). The
envelope is checked here, bounded so a hostile author cannot lock others out with a version
from the far future or defeat the staleness check with a timestamp ahead of the clock; the map's
fit to an engine is checked by ``maps.validate_map``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_VERSION = 10**9  # one publication per minInterval (>= 1 min) for ~1,900 years
MAX_CLOCK_SKEW_S = 300.0  # a document may claim to be this far ahead of the reader's clock
EARLIEST = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
_KNOWN = {
    "version",
    "physical_to_logical_map",
    "physicalToLogicalMap",
    "generated_at",
    "generatedAt",
    "source",
}


class DocumentError(ValueError):
    """A placement document whose envelope is malformed or out of bounds."""


@dataclass(frozen=True)
class PlacementDoc:
    """A versioned map; ``generated_at`` (unix s) says when its author last vouched for it."""

    version: int
    physical_to_logical_map: npt.NDArray[Any]
    generated_at: float
    source: str = "operator"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "version": self.version,
            "generated_at": self.generated_at,
            "source": self.source,
            "physical_to_logical_map": self.physical_to_logical_map.tolist(),
        }

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.generated_at


def render(version: int, phy2log: npt.ArrayLike, generated_at: datetime) -> dict[str, Any]:
    """The document the operator publishes (ConfigMap data and push body)."""
    return {
        "version": version,
        "generatedAt": generated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "physicalToLogicalMap": np.asarray(phy2log, dtype=np.int64).tolist(),
    }


def parse(doc: Any, *, now: float | None = None, default_generated_at: float | None = None) -> PlacementDoc:
    """The envelope of a document, checked and bounded (its map is not yet checked against an engine)."""
    if not isinstance(doc, Mapping):
        raise DocumentError("placement must be a JSON object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_VERSION:
        raise DocumentError(f"placement needs an integer version in [0, {MAX_VERSION}]")
    raw_map = doc.get("physical_to_logical_map", doc.get("physicalToLogicalMap"))
    if raw_map is None:
        raise DocumentError("placement needs physical_to_logical_map")
    try:
        arr = np.asarray(raw_map)
    except (ValueError, TypeError) as exc:
        raise DocumentError(f"physical_to_logical_map is not rectangular: {exc}") from exc
    if arr.dtype == object:
        raise DocumentError("physical_to_logical_map is not a rectangular array of numbers")
    generated = parse_time(doc.get("generated_at", doc.get("generatedAt")))
    if generated is None:
        if default_generated_at is None:
            raise DocumentError("placement needs generated_at")
        generated = default_generated_at
    check_time(generated, time.time() if now is None else now, "generated_at")
    source = doc.get("source", "operator")
    if not isinstance(source, str) or len(source) > 64:
        raise DocumentError("placement source must be a short string")
    extra = {k: v for k, v in doc.items() if k not in _KNOWN}
    return PlacementDoc(version, arr, generated, source, extra)


def parse_time(value: Any) -> float | None:
    """Unix seconds from a number, a numeric string or an RFC 3339 time; None when absent."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and len(value) <= 64:
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            raise DocumentError(f"bad timestamp {value!r}") from exc
    raise DocumentError(f"bad timestamp {str(value)[:64]!r}")


def check_time(t: float, now: float, what: str) -> float:
    """A finite time after 2024 and not ahead of ``now`` by more than the allowed clock skew."""
    if not math.isfinite(t) or t < EARLIEST:
        raise DocumentError(f"{what} must be a finite time after 2024-01-01, got {t!r}")
    if t > now + MAX_CLOCK_SKEW_S:
        raise DocumentError(
            f"{what} is {t - now:.0f}s in the future (clocks may differ by {MAX_CLOCK_SKEW_S:.0f}s)"
        )
    return t
