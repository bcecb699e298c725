"""Small helpers shared by the rule modules."""

from __future__ import annotations

GIB = 2**30


def gib(value: float) -> str:
    """Bytes as GiB with one decimal, for messages."""
    return f"{value / GIB:.1f} GiB"
