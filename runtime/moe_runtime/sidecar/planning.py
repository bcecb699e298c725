"""The runtime plans its own instance (``PUT /v1/plan``, ``GET /v1/plan``; docs/scale.md, "Where
planning runs").

Planning is the control loop's whole cost at fleet scale, and this runtime already holds its
instance's windows. The operator sends what only it holds (moe_contract.plan_wire: the pool's
prior on its time buckets, the map it believes runs, the shape, the move cap); the runtime sums
its own windows on the same buckets (moe_placement.instances.own_history) and makes the same
planning call the operator would (plan_one), so the same inputs give the same map wherever it
runs. The operator trusts nothing of the answer but the map, which it checks and scores itself.

One worker thread plans, never the event loop (a DeepSeek-V3 plan takes seconds) and never the
ingest worker (windows keep arriving meanwhile). Only one request waits: a newer one replaces a
queued one that has not started; a running plan finishes and keeps its result under its request
id. The last few proposals are kept by id, so the operator can poll for its own.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from moe_contract.plan_wire import PlanRequest
from moe_placement.instances import own_history, plan_one
from moe_placement.maps import IntArray
from moe_runtime.sidecar.metrics import RuntimeMetrics
from moe_runtime.sidecar.state import EngineLayout, SidecarState

log = logging.getLogger("moe_runtime.sidecar")

KEEP: Final = 8  # proposals kept by request id (one a control-loop interval is the usual rate)
MESSAGE_CHARS: Final = 300  # a failure's message to the peer: short, no traceback


class PlanFailed(Exception):
    """A request this runtime cannot plan; the message is what the operator reads."""


@dataclass
class Proposal:
    """One request's progress and, when done, its map."""

    request: str
    state: str  # queued, planning, done, failed
    seconds: float | None = None
    message: str | None = None
    physical_to_logical_map: IntArray | None = None
    newest_seq: int | None = None

    def to_json(self) -> dict[str, Any]:
        m = self.physical_to_logical_map
        return {
            "request": self.request,
            "state": self.state,
            "seconds": self.seconds,
            "message": self.message,
            "physical_to_logical_map": None if m is None else m.tolist(),
            "newest_seq": self.newest_seq,
        }


IDLE: Final[dict[str, Any]] = {
    "request": None, "state": "idle", "seconds": None, "message": None,
    "physical_to_logical_map": None, "newest_seq": None,
}  # fmt: skip


def layout_mismatch(req: PlanRequest, layout: EngineLayout) -> str | None:
    """What the request gets wrong about this runtime's engine, naming the field to change; None
    when it agrees with everything known here."""
    layers, experts = (int(n) for n in req.prior.shape[1:])
    asked: tuple[tuple[str, object, object], ...] = (
        ("num_layers", layers, layout.num_layers),
        ("num_experts", experts, layout.num_experts),
        ("num_physical", int(req.current.shape[1]), layout.num_physical),
        ("num_gpus", req.num_gpus, layout.num_gpus),
        ("num_redundant", req.num_redundant, layout.num_redundant),
        ("dispatch", req.dispatch, layout.dispatch),
    )
    for name, theirs, ours in asked:
        if ours is not None and theirs != ours:
            return f"{name}: the request says {theirs!r}, this runtime's engine has {ours!r}"
    return None


def plan_request(state: SidecarState, req: PlanRequest) -> tuple[IntArray, int]:
    """The map for ``req`` on this runtime's windows and the newest window's seq; PlanFailed when
    the newest window is older than ``fresh_after`` (nothing new to plan on)."""
    windows = state.windows_after(0, state.ring_size)  # a snapshot, taken under the ring's lock
    if not windows or windows[-1].record.ended_at < req.fresh_after:
        ended = f"ended at {windows[-1].record.ended_at}" if windows else "none yet"
        raise PlanFailed(f"no fresh window: the newest {ended}, the request wants one from {req.fresh_after}")
    newest = windows[-1]
    shape = (int(req.prior.shape[1]), int(req.prior.shape[2]))
    if newest.record.counts.shape != shape:
        raise PlanFailed(f"windows of shape {newest.record.counts.shape}, the request's {shape}")
    own = own_history(
        [(w.record.ended_at, w.record.counts) for w in windows if w.record.counts.shape == shape],
        req.keys,
        req.bucket_s,
        shape,
    )
    plan = plan_one(
        own, num_gpus=req.num_gpus, num_nodes=req.num_nodes, num_redundant=req.num_redundant,
        num_groups=req.num_groups, prior=req.prior, steps=newest.record.steps, current=req.current,
        dispatch=req.dispatch, max_moves=req.max_moves,
    )  # fmt: skip
    return plan.physical_to_logical_map, newest.seq


def _short(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, PlanFailed) and exc.args else f"{type(exc).__name__}: {exc}"
    return str(text)[:MESSAGE_CHARS]


class PlanWorker:
    """One planning thread, one waiting request, the last KEEP proposals by request id."""

    def __init__(self, state: SidecarState, metrics: RuntimeMetrics) -> None:
        self.state = state
        self.metrics = metrics
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="moe-sidecar-plan")
        self._lock = threading.Lock()
        self._queued: PlanRequest | None = None  # set iff a _run is waiting in the executor for it
        self._proposals: OrderedDict[str, Proposal] = OrderedDict()
        self._newest: str | None = None

    def submit(self, req: PlanRequest) -> dict[str, Any]:
        """Queue ``req`` (replacing a queued one); a request id already queued, planning or done
        answers its proposal as it stands (a retried PUT plans nothing twice)."""
        with self._lock:
            known = self._proposals.get(req.request)
            if known is not None and known.state != "failed":
                return known.to_json()
            start = self._queued is None
            if self._queued is not None:
                old = self._proposals.get(self._queued.request)
                if old is not None:
                    old.state, old.message = "failed", f"replaced by request {req.request}"
                self.metrics.plans.labels("replaced").inc()
            self._queued = req
            self._remember(Proposal(req.request, "queued"))
            self._newest = req.request
            answer = self._proposals[req.request].to_json()
        if start:
            self._executor.submit(self._run)
        return answer

    def proposal(self, request: str | None = None) -> dict[str, Any] | None:
        """``request``'s proposal (None when not kept); without one, the newest request's, or idle."""
        with self._lock:
            name = self._newest if request is None else request
            found = self._proposals.get(name) if name is not None else None
            if found is None:
                return dict(IDLE) if request is None else None
            return found.to_json()

    def close(self) -> None:
        """Drop the waiting request; a running plan ends on its own (its thread is not killed)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _remember(self, p: Proposal) -> None:
        self._proposals.pop(p.request, None)
        self._proposals[p.request] = p
        while len(self._proposals) > KEEP:
            self._proposals.popitem(last=False)

    def _run(self) -> None:
        with self._lock:
            req, self._queued = self._queued, None
            if req is None:
                return
            self._set(req.request, state="planning")
        started = time.monotonic()
        try:
            phy2log, seq = plan_request(self.state, req)
        except Exception as exc:  # the peer reads a short message; the log keeps the rest
            if not isinstance(exc, PlanFailed):
                log.warning("planning request %s failed", req.request, exc_info=True)
            self.metrics.plans.labels("failed").inc()
            with self._lock:
                self._set(req.request, state="failed", message=_short(exc))
            return
        seconds = time.monotonic() - started
        self.metrics.plans.labels("done").inc()
        self.metrics.plan_seconds.observe(seconds)
        with self._lock:
            self._set(
                req.request, state="done", seconds=seconds, physical_to_logical_map=phy2log, newest_seq=seq
            )

    def _set(self, request: str, **changes: Any) -> None:
        """Update a kept proposal (called with the lock held); one evicted meanwhile stays gone."""
        p = self._proposals.get(request)
        if p is not None:
            for key, value in changes.items():
                setattr(p, key, value)
