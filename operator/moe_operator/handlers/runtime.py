"""Process-wide state of a running operator: its API client and settings (set once at start)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from moe_operator.handlers.kube import Kube
from moe_operator.render.group import RuntimeSettings

_kube: Kube | None = None
_settings = RuntimeSettings()
_executor: Executor | None = None
_leaderworkerset_watched = False
T = TypeVar("T")


def configure(kube: Kube, settings: RuntimeSettings) -> None:
    global _kube, _settings
    _kube, _settings = kube, settings


def kube() -> Kube:
    if _kube is None:
        raise RuntimeError("the operator's Kubernetes client is not configured (moe-operator run sets it)")
    return _kube


def settings() -> RuntimeSettings:
    return _settings


def note_leaderworkerset_watched(served_at_start: bool) -> None:
    """Whether leaderworkerset.x-k8s.io/v1 was served when the operator started.

    kopf only sees resources that discovery lists when it starts or right when a CRD event
    arrives; a CRD installed later is typically listed by discovery after its last event, so
    kopf never watches it until a restart. LeaderWorkerSets are used only when watched.
    """
    global _leaderworkerset_watched
    _leaderworkerset_watched = served_at_start


def leaderworkerset_watched() -> bool:
    return _leaderworkerset_watched


def use_executor(executor: Executor) -> None:
    """kopf's thread pool (set at startup): async handlers hand blocking work to the same pool."""
    global _executor
    _executor = executor


async def in_thread(fn: Callable[..., T], *args: object) -> T:
    """Run a blocking call in the operator's thread pool, as kopf runs sync handlers.

    The context is copied (kopf.event finds its event queue there), and cancellation waits for
    the thread to finish rather than leaving it orphaned, also as kopf does.
    """
    context = contextvars.copy_context()
    future = asyncio.get_running_loop().run_in_executor(_executor, functools.partial(context.run, fn, *args))
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    return future.result()
