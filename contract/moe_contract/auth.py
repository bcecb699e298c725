"""Per-instance runtime credentials: what the operator derives and what an engine pod may hold.

The operator keeps one random key per MoEDeployment. The bearer token for an instance's runtime
API is HMAC-SHA256(key, instance name); an engine pod holds only the SHA-256 digests of the
tokens (``digests.json``), never the key and never a token. So a compromised engine pod can
neither call another instance's runtime (it holds no token) nor derive one (it lacks the key),
and a token seen on the wire opens exactly one instance. Digests are derived up front for every
instance name the spec's bounds allow, so the Secret is written once and scaling never edits it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from typing import Final

KEY_BYTES: Final = 32
KEY_FIELD: Final = "key"  # the Secret's key field (hex); never projected into a pod
DIGESTS_FILE: Final = "digests.json"  # the only field engine pods mount
MAX_INSTANCES: Final = 1024  # 2 pools x 256 replicas (the spec's bound), with room
MAX_DIGESTS_BYTES: Final = 256 * 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CONTEXT: Final = b"moe-runtime-token/v1\x00"


def instance_token(key: bytes, instance: str) -> str:
    """The bearer token for one instance's runtime API."""
    if len(key) < 16:
        raise ValueError("the runtime key must have at least 16 bytes")
    return hmac.new(key, _CONTEXT + instance.encode(), hashlib.sha256).hexdigest()


def token_digest(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def digests_document(key: bytes, instances: Iterable[str]) -> str:
    """``digests.json``: {instance: sha256(token)}, sorted, for an engine pod to check tokens with."""
    digests = {name: token_digest(instance_token(key, name)) for name in instances}
    if len(digests) > MAX_INSTANCES:
        raise ValueError(f"at most {MAX_INSTANCES} instances per deployment, got {len(digests)}")
    return json.dumps({"digests": digests}, sort_keys=True, separators=(",", ":"))


def parse_digests(text: str) -> dict[str, str]:
    """The digests a ``digests.json`` holds; ValueError for anything else (size, shape, names)."""
    if len(text) > MAX_DIGESTS_BYTES:
        raise ValueError(f"{DIGESTS_FILE} is larger than {MAX_DIGESTS_BYTES} bytes")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{DIGESTS_FILE} is not JSON: {exc}") from None
    digests = doc.get("digests") if isinstance(doc, dict) else None
    if not isinstance(digests, dict) or len(digests) > MAX_INSTANCES:
        raise ValueError(f'{DIGESTS_FILE} must be {{"digests": {{instance: sha256 hex}}}}')
    for name, digest in digests.items():
        if not _NAME.match(name) or not isinstance(digest, str) or not _HEX64.match(digest):
            raise ValueError(f"{DIGESTS_FILE}: bad entry for {name[:64]!r}")
    return dict(digests)


def token_matches(digests: dict[str, str], instance: str, given: str) -> bool:
    """Whether ``given`` is this instance's token (constant-time on the digest)."""
    expected = digests.get(instance)
    return expected is not None and hmac.compare_digest(token_digest(given), expected)
