"""Names and labels every child object carries, so indexes, selectors and users can find them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from moe_operator.api import keys as K


def base_labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "moe-engine" if component in ("prefill", "decode") else f"moe-{component}",
        "app.kubernetes.io/instance": name,
        K.COMPONENT: component,
        "app.kubernetes.io/part-of": name,
        K.MANAGED_BY_KEY: K.MANAGED_BY,
        K.DEPLOYMENT: name,
    }


def pool_selector(name: str, pool: str) -> dict[str, str]:
    return {K.DEPLOYMENT: name, K.POOL: pool}


def instance_selector(name: str, pool: str, index: int) -> dict[str, str]:
    return {K.DEPLOYMENT: name, K.POOL: pool, K.INSTANCE: str(index)}


def instance_name(name: str, pool: str, index: int) -> str:
    return f"{name}-{pool}-{index}"


def content_hash(obj: Any) -> str:
    """A short stable hash of an object's desired content: unchanged hash means no write."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
