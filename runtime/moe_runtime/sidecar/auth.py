"""Bearer-token check for the runtime API, from a mounted Secret, re-read when it changes.

In an engine pod the Secret's directory holds ``digests.json`` (moe_contract.auth): the SHA-256
of each instance's token, so this pod can check the token meant for its own instance and holds
nothing that opens another. Outside pods (the replay engine, tests) a plain token file works too.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from moe_contract.auth import DIGESTS_FILE, parse_digests, token_matches
from moe_runtime import exchange


class _Cached:
    """A small file's text, read again only when its mtime or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: exchange.FileKey | None = None
        self._text: str | None = None

    def text(self) -> str | None:
        key = exchange.file_key(self.path)
        if key is None:
            self._key, self._text = None, None
            return None
        if key != self._key:
            try:
                self._text = self.path.read_text()
            except OSError:
                self._text = None
            self._key = key
        return self._text


class TokenFile:
    def __init__(self, path: Path | None, instance: str = "") -> None:
        self.path = path
        self.instance = instance
        self._token = _Cached(path) if path is not None else None
        self._digests = _Cached(path.parent / DIGESTS_FILE) if path is not None else None

    def token(self) -> str | None:
        """The plain token, or None when no (non-empty) token file exists."""
        text = self._token.text() if self._token is not None else None
        return (text or "").strip() or None

    def _check_digest(self, given: str, text: str) -> tuple[bool, str]:
        try:
            digests = parse_digests(text)
        except ValueError as exc:
            return False, f"writes are disabled: {exc}"
        if not self.instance or self.instance not in digests:
            return False, f"writes are disabled: no token digest for instance {self.instance!r}"
        if not token_matches(digests, self.instance, given):
            return False, "wrong bearer token"
        return True, ""

    def check(self, authorization: str | None) -> tuple[bool, str]:
        """(allowed, reason). Without a configured token every request is refused."""
        digests = self._digests.text() if self._digests is not None else None
        expected = None if digests is not None else self.token()
        if digests is None and expected is None:
            return False, f"writes are disabled: no token in {self.path}"
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return False, "missing bearer token"
        if digests is not None:
            return self._check_digest(given.strip(), digests)
        assert expected is not None
        if not hmac.compare_digest(given.strip().encode(), expected.encode()):
            return False, "wrong bearer token"
        return True, ""
