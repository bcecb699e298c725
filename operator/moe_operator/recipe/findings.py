"""A finding of the recipe's checks, and how they read the arguments a pool ends up with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from moe_contract.flags import engine_catalog, resolve


@dataclass(frozen=True)
class Finding:
    """``refuse``: cannot start or crashes under load (admission refuses); ``warn``: loses throughput."""

    severity: Literal["refuse", "warn"]
    field: str
    message: str


def last_value(args: list[str], dest: str, every: bool = False) -> str | None:
    """The value argparse ends with for ``dest`` (the last occurrence); a list flag's values joined by
    spaces when ``every``, else its last one; "" for a switch."""
    occ = resolve(engine_catalog(), args).last(dest)
    if occ is None:
        return None
    value = occ.value
    if isinstance(value, dict):  # a JSON-typed flag (--cuda-graph-config), already parsed
        return json.dumps(value)
    if isinstance(value, list):
        if every:
            return " ".join(str(v) for v in value)
        value = value[-1] if value else None
    return "" if value is None else str(value)


def as_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
