"""The runtime key's Secret: trusted only when this deployment created it (pure)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from moe_contract.auth import DIGESTS_FILE, KEY_BYTES, KEY_FIELD
from moe_operator.render.labels import instance_name


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``uid`` is the object's controller (the operator sets itself so on what it creates)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("controller") and r.get("uid") == uid for r in refs)


def key_of(secret: Mapping[str, Any] | None, uid: str) -> bytes | None:
    """The deployment's runtime key (moe_contract.auth) a Secret holds, or None: missing, malformed,
    or not this deployment's. Instance tokens are derived from it; engine pods mount only digests."""
    if not secret or not owned_by(secret, uid):
        return None
    data = secret.get("data") or {}
    raw, digests = data.get(KEY_FIELD), data.get(DIGESTS_FILE)
    if not isinstance(raw, str) or not isinstance(digests, str):
        return None
    try:
        key = bytes.fromhex(base64.b64decode(raw, validate=True).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return key if len(key) == KEY_BYTES else None


def instance_of(pod: Mapping[str, Any], deployment: str) -> str:
    """The instance name a trusted engine pod belongs to (its runtime checks that instance's token)."""
    return instance_name(deployment, str(pod["pool"]), int(pod["instance"]))
