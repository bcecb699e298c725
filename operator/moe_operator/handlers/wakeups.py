"""Which deployments to reconcile on the next timer tick: a child changed, or the catch-up period passed.

kopf does not call a parent's handlers when its children change, and a plain 5 s timer makes
"pods became ready" visible seconds late. Child events mark their deployment here; a cheap 1 s
tick reconciles only the marked ones, and every deployment at least once per period.

New specs first: while a created or changed deployment waits for its first reconcile, a due
tick of another deployment holds back for at most max_defer_s, so a burst of applies gets its
children created before the status of older deployments is refreshed (both compete for the
same thread pool and API server), and a steady stream of applies delays nothing by more.
"""

from __future__ import annotations

import threading

Key = tuple[str, str]


class Wakeups:
    """Thread-safe marks keyed by (namespace, deployment name)."""

    def __init__(self, period_s: float, max_defer_s: float = 2.0, pending_ttl_s: float = 30.0) -> None:
        self.period_s = period_s
        self.max_defer_s = max_defer_s
        self.pending_ttl_s = pending_ttl_s
        self._dirty: set[Key] = set()
        self._last: dict[Key, float] = {}
        self._pending: dict[Key, float] = {}  # spec not reconciled yet -> since when
        self._held: dict[Key, float] = {}  # due but held back for pending specs -> since when
        self._lock = threading.Lock()

    def mark(self, key: Key) -> None:
        with self._lock:
            self._dirty.add(key)

    def pending(self, key: Key, now: float) -> None:
        """A spec generation the reconciler has not handled yet (its change handler will)."""
        with self._lock:
            self._pending.setdefault(key, now)

    def reconciled(self, key: Key, now: float) -> None:
        with self._lock:
            self._last[key] = now

    def settled(self, key: Key) -> None:
        """The change handler reconciled the pending spec."""
        with self._lock:
            self._pending.pop(key, None)

    def due(self, key: Key, now: float) -> bool:
        """True (and the mark is consumed) when a child changed or the period elapsed since the last
        run, unless other deployments' new specs go first (see the module docstring)."""
        with self._lock:
            for k in [k for k, since in self._pending.items() if now - since > self.pending_ttl_s]:
                del self._pending[k]  # its change handler keeps failing: stop holding others back
            if key in self._pending:
                return False  # the change handler is on it
            last = self._last.get(key, float("-inf"))
            if key not in self._dirty and now - last < self.period_s:
                return False
            if self._pending and now - self._held.setdefault(key, now) < self.max_defer_s:
                return False
            self._held.pop(key, None)
            self._dirty.discard(key)
            self._last[key] = now
            return True

    def forget(self, key: Key) -> None:
        with self._lock:
            self._dirty.discard(key)
            self._last.pop(key, None)
            self._pending.pop(key, None)
            self._held.pop(key, None)
