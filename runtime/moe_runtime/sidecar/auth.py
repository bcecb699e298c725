"""Bearer-token check for writes; the token is a mounted Secret file, re-read when it changes."""

from __future__ import annotations

import hmac
from pathlib import Path


class TokenFile:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._key: tuple[int, int] | None = None
        self._token: str | None = None

    def token(self) -> str | None:
        """The current token, or None when no (non-empty) token file exists."""
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            self._key, self._token = None, None
            return None
        key = (st.st_mtime_ns, st.st_size)
        if key != self._key:
            try:
                self._token = self.path.read_text().strip() or None
            except OSError:
                self._token = None
            self._key = key
        return self._token

    def check(self, authorization: str | None) -> tuple[bool, str]:
        """(allowed, reason). Without a configured token every write is refused."""
        expected = self.token()
        if expected is None:
            return False, f"writes are disabled: no token in {self.path}"
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            return False, "missing bearer token"
        if not hmac.compare_digest(given.strip().encode(), expected.encode()):
            return False, "wrong bearer token"
        return True, ""
