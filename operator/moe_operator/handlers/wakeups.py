"""Which deployments to reconcile on the next timer tick: a child changed, or the catch-up period passed.

kopf does not call a parent's handlers when its children change, and a plain 5 s timer makes
"pods became ready" visible seconds late. Child events mark their deployment here; a cheap 1 s
tick reconciles only the marked ones, and every deployment at least once per period.
"""

from __future__ import annotations

import threading

Key = tuple[str, str]


class Wakeups:
    """Thread-safe marks keyed by (namespace, deployment name)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._dirty: set[Key] = set()
        self._last: dict[Key, float] = {}
        self._lock = threading.Lock()

    def mark(self, key: Key) -> None:
        with self._lock:
            self._dirty.add(key)

    def reconciled(self, key: Key, now: float) -> None:
        with self._lock:
            self._last[key] = now

    def due(self, key: Key, now: float) -> bool:
        """True (and the mark is consumed) when a child changed or the period elapsed since the last run."""
        with self._lock:
            if key in self._dirty or now - self._last.get(key, float("-inf")) >= self.period_s:
                self._dirty.discard(key)
                self._last[key] = now
                return True
            return False

    def forget(self, key: Key) -> None:
        with self._lock:
            self._dirty.discard(key)
            self._last.pop(key, None)
