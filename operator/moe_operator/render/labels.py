"""Names and labels every child object carries, so indexes, selectors and users can find them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

DOMAIN = "moe.inference.dev"
DEPLOYMENT = f"{DOMAIN}/deployment"
DEPLOYMENT_UID = f"{DOMAIN}/deployment-uid"
POOL = f"{DOMAIN}/pool"
INSTANCE = f"{DOMAIN}/instance"
RANK = f"{DOMAIN}/rank"
SPEC_HASH = f"{DOMAIN}/spec-hash"
TEMPLATE_HASH = f"{DOMAIN}/template-hash"
PLACEMENT = f"{DOMAIN}/placement"
GROUP_EPOCH = f"{DOMAIN}/group-epoch"
GROUP_RESTARTS = f"{DOMAIN}/group-restarts"
GROUP_MEMBERS = f"{DOMAIN}/group-members"
MANAGED_BY = "moe-operator"
FIELD_MANAGER = "moe-operator"


def base_labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "moe-engine" if component in ("prefill", "decode") else f"moe-{component}",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        DEPLOYMENT: name,
    }


def pool_selector(name: str, pool: str) -> dict[str, str]:
    return {DEPLOYMENT: name, POOL: pool}


def instance_selector(name: str, pool: str, index: int) -> dict[str, str]:
    return {DEPLOYMENT: name, POOL: pool, INSTANCE: str(index)}


def instance_name(name: str, pool: str, index: int) -> str:
    return f"{name}-{pool}-{index}"


def content_hash(obj: Any) -> str:
    """A short stable hash of an object's desired content: unchanged hash means no write."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
