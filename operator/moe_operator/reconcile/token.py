"""The runtime token's Secret: trusted only when this deployment created it (pure)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``uid`` is the object's controller (the operator sets itself so on what it creates)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("controller") and r.get("uid") == uid for r in refs)


def token_of(secret: Mapping[str, Any] | None, uid: str) -> str | None:
    """The token a Secret holds, or None: missing, empty, not base64, or not this deployment's (a
    Secret someone else made under the expected name must not decide who may push placements)."""
    if not secret or not owned_by(secret, uid):
        return None
    raw = (secret.get("data") or {}).get("token")
    if not isinstance(raw, str):
        return None
    try:
        token = base64.b64decode(raw, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return token or None
