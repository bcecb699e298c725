"""Everything a running operator process remembers, in one object built by `moe-operator run`.

Handlers reach it through kopf's memo (``memo.operator``). Per-deployment state is keyed by
uid and dropped when the deployment is deleted; what bridges the watch lag expires by time.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from moe_operator.autoscale.signals import Scrape
from moe_operator.control.windows import History
from moe_operator.handlers.kube import Kube
from moe_operator.handlers.metrics import OperatorMetrics
from moe_operator.handlers.wakeups import Wakeups
from moe_operator.lifecycle import StartReport
from moe_operator.reconcile.children import ChildKey
from moe_operator.render.group import RuntimeSettings
from moe_operator.validation.platform import DEFAULT_POLICY, PlatformPolicy

T = TypeVar("T")
APPLY_GRACE_S = 30.0  # how long an applied object counts as applied before the watch shows it


@dataclass
class InstanceMemo:
    """What the loop remembers of one instance (eplb mode operator): its last push and change."""

    version: int = 0  # pushed and taken
    changed_at: float | None = None  # when this loop last gave it a new map
    predicted: float | None = None  # what that map was predicted to reach
    measured: float | None = None  # its own latest window, last evaluation


@dataclass
class PoolState:
    """The control loop's memory of one pool; rebuilt from status and ConfigMaps after a restart."""

    history: History = field(default_factory=History)
    version: int = 0
    current: np.ndarray | None = None
    doc: dict[str, Any] | None = None
    published_at: float | None = None
    evaluated_at: float | None = None
    loaded: bool = False
    restored_buckets: int = 0  # load-history buckets read back from the history ConfigMap
    refused: str | None = None  # the live ConfigMap content last refused (its event was posted)
    instances: dict[str, InstanceMemo] = field(default_factory=dict)  # leader pod name -> memo


@dataclass
class DeploymentState:
    """What the operator remembers of one MoEDeployment (by uid) between reconciles."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    claims: dict[str, int] = field(default_factory=dict)  # node -> GPUs its current plan holds
    token_present: bool = False
    applied: dict[ChildKey, tuple[str, float]] = field(default_factory=dict)  # -> (spec hash, when)
    pools: dict[str, PoolState] = field(default_factory=dict)
    condition_reasons: dict[str, str] = field(default_factory=dict)  # condition type -> exported reason
    # (pool, instance) -> (its leader's start-up phase, or None; when asked): handlers/start_probe.py
    starts: dict[tuple[str, int], tuple[StartReport | None, float]] = field(default_factory=dict)
    compute_domain_noted: int | None = None  # generation whose missing ComputeDomain API an event named
    monitoring_noted: int | None = None  # generation whose skipped spec.monitoring objects an event named
    # (pool, instance, leader pod uid) -> its last /metrics read: handlers/autoscale_loop.py
    scrapes: dict[tuple[str, int, str], Scrape] = field(default_factory=dict)

    def remember_applied(self, key: ChildKey, spec_hash: str, now: float) -> None:
        self.applied[key] = (spec_hash, now)

    def recently_applied(self, now: float) -> dict[ChildKey, str]:
        """Objects applied within APPLY_GRACE_S; older entries are dropped."""
        for key in [k for k, (_, t) in self.applied.items() if now - t >= APPLY_GRACE_S]:
            del self.applied[key]
        return {k: h for k, (h, _) in self.applied.items()}


@dataclass
class OperatorState:
    """One per process: the API client, settings, metrics and every deployment's state."""

    kube: Kube
    settings: RuntimeSettings
    metrics: OperatorMetrics
    wakeups: Wakeups
    platform: PlatformPolicy = DEFAULT_POLICY  # what tenants' specs may put into pods (validation.platform)
    # optional kinds (LeaderWorkerSet, PodMonitor, PrometheusRule) served when the operator started:
    # kopf watches only what discovery listed then, so only these can be used until a restart
    watched_kinds: frozenset[str] = frozenset()
    executor: Executor | None = None
    planning: str = "runtimes"  # each instance's runtime plans it, or "operator" (docs/scale.md)
    plan_lock: threading.Lock = field(default_factory=threading.Lock)  # one topology plan at a time
    _deployments: dict[str, DeploymentState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def deployment(self, uid: str) -> DeploymentState:
        with self._lock:
            return self._deployments.setdefault(uid, DeploymentState())

    def forget(self, uid: str, namespace: str, name: str) -> None:
        """A deployment was deleted: drop its state, its metric series and its wake-up marks."""
        with self._lock:
            self._deployments.pop(uid, None)
        self.metrics.forget(namespace, name)
        self.wakeups.forget((namespace, name))

    def claims_of_others(self, uid: str) -> dict[str, int]:
        """GPUs per node that other deployments' current plans hold."""
        out: dict[str, int] = {}
        with self._lock:
            others = [d.claims for owner, d in self._deployments.items() if owner != uid]
        for claims in others:
            for node, gpus in list(claims.items()):
                out[node] = out.get(node, 0) + gpus
        return out

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking call in kopf's thread pool, as kopf runs sync handlers.

        The context is copied (kopf.event finds its event queue there), and cancellation waits
        for the thread to finish rather than leaving it orphaned, also as kopf does.
        """
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.executor, functools.partial(context.run, fn, *args))
        cancelled: asyncio.CancelledError | None = None
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            raise cancelled
        return future.result()


def operator_of(memo: Any) -> OperatorState:
    """The process's state from a handler's memo (set by `moe-operator run`)."""
    state = getattr(memo, "operator", None)
    if not isinstance(state, OperatorState):
        raise RuntimeError("the operator's state is not configured: start it with `moe-operator run`")
    return state
