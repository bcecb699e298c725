"""Worker threads that take the most urgent job first (lowest priority number, then arrival).

The operator's applies share one bounded pool across every reconcile: in a burst of new
deployments, FIFO would put each deployment's StatefulSets behind every other deployment's
Services, and no pod would start until the whole burst's objects were written; the reconcile
that started first goes first, wave by wave.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_Job = tuple[tuple[float, ...], int, Callable[..., Any] | None, tuple[Any, ...], "Future[Any] | None"]


class PriorityPool:
    """``submit(priority, fn, *args)`` -> Future; lower priorities (numbers, or tuples of them)
    run first, FIFO within one."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for t in self._threads:
            t.start()

    def submit(self, priority: float | tuple[float, ...], fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        key = priority if isinstance(priority, tuple) else (priority,)
        self._queue.put((key, next(self._order), fn, args, future))
        return future

    def _work(self) -> None:
        while True:
            _, _, fn, args, future = self._queue.get()
            if fn is None or future is None:  # shutdown
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, as ThreadPoolExecutor does
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Let queued jobs finish, then stop every worker."""
        for _ in self._threads:
            self._queue.put(((float("inf"),), next(self._order), None, (), None))
        for t in self._threads:
            t.join()
