"""The expert-placement control loop: a thin kopf timer around moe_operator.control.

Every TICK_S it checks each pool of each MoEDeployment; when spec.eplb.refreshInterval
has passed it collects load windows from every instance's leader runtime, plans, decides,
publishes a versioned placement ConfigMap, pushes it (mode operator) and records status.
Failures publish nothing, say why in status.placement.<pool>.message and count a metric.
Status is written only when something besides the evaluation time changed, so an idle
or broken pool costs no API writes after the first report.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import kopf
import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from moe_contract.pod import SIDECAR_PORT
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.derived import pool_layout, resolve_architecture, world_size
from moe_operator.api.types import parse_duration
from moe_operator.control import history_store
from moe_operator.control.evaluate import Evaluation, Policy, PoolShape, evaluate
from moe_operator.control.placement import document, trivial_map
from moe_operator.control.publish import (
    configmaps,
    expired_versions,
    history_configmap,
    history_name,
)
from moe_operator.control.rollback import PAUSED
from moe_operator.control.windows import History, parse_windows
from moe_operator.handlers import runtime as rt
from moe_operator.handlers.kube import KubeError
from moe_operator.render.group import Owner, placement_config_name

GROUP, RESOURCE = "moe.inference.dev", "moedeployments"
TICK_S = 5.0
HTTP_TIMEOUT_S = 3.0
LABELS = ["namespace", "deployment", "pool"]

REBALANCES = Counter("moe_operator_rebalances_total", "Placements published", LABELS)
FAILURES = Counter(
    "moe_operator_rebalance_failures_total",
    "Evaluations that could not produce or deliver a placement (no windows, planner or API error, refused push)",
    [*LABELS, "reason"],
)
SKIPS = Counter(
    "moe_operator_placement_skips_total", "Evaluations that published nothing", [*LABELS, "reason"]
)
PUSHES = Counter("moe_operator_placement_pushes_total", "Placement pushes to runtimes", [*LABELS, "result"])
DURATION = Histogram("moe_operator_placement_evaluation_seconds", "Time of one pool evaluation", LABELS)
BALANCE = Gauge("moe_operator_placement_balancedness", "Balancedness (mean/max GPU load)", [*LABELS, "kind"])
VERSION = Gauge("moe_operator_placement_version", "Published placement version (0: trivial)", LABELS)
AGE = Gauge("moe_operator_placement_age_seconds", "Seconds since the placement was published", LABELS)


@dataclass
class PoolState:
    """In-memory state of one pool; rebuilt from status and the ConfigMap after a restart."""

    history: History = field(default_factory=History)
    version: int = 0
    current: np.ndarray | None = None
    doc: dict[str, Any] | None = None
    published_at: float | None = None
    evaluated_at: float | None = None
    loaded: bool = False
    restored_buckets: int = 0  # load-history buckets read back from the history ConfigMap


# (namespace, name, uid, pool): a deployment re-created under the same name starts afresh
# (its placement ConfigMaps were garbage-collected with the old object).
_states: dict[tuple[str, str, str, str], PoolState] = {}
_lock = threading.Lock()


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load(
    state: PoolState, status: dict[str, Any], namespace: str, name: str, pool: str, shape: PoolShape
) -> None:
    """After a restart: versions from status, the load history from its own ConfigMap (the map: _sync_live)."""
    state.loaded = True
    state.version = int(status.get("version") or 0)
    state.published_at = _ts(status.get("updateTime"))
    state.evaluated_at = _ts(status.get("lastEvaluationTime"))
    stored = rt.kube().get(f"/api/v1/namespaces/{namespace}/configmaps/{history_name(name, pool)}")
    text = ((stored or {}).get("data") or {}).get(history_store.KEY)
    snap = history_store.decode(text, (shape.num_layers, shape.num_experts)) if text else None
    if snap is not None:
        state.history.restore(history_store.restored_windows(snap), snap.cursors)
        state.restored_buckets = len(snap.keys)


def _sync_live(state: PoolState, namespace: str, name: str, pool: str, shape: PoolShape) -> tuple[str, bool]:
    """Read the live ConfigMap: the pause reason ('' when not paused) and whether a newer version,
    published outside the loop (a rollback), was adopted. The first read after a start adopts too.
    """
    cm = rt.kube().get(f"/api/v1/namespaces/{namespace}/configmaps/{placement_config_name(name, pool)}")
    if not cm:
        return "", False
    paused = str(((cm.get("metadata") or {}).get("annotations") or {}).get(PAUSED) or "")
    try:
        doc = json.loads((cm.get("data") or {}).get("placement.json") or "{}")
        version = int(doc.get("version") or 0)
        arr = np.asarray(doc.get("physicalToLogicalMap"), dtype=np.int64)
    except (ValueError, TypeError, AttributeError):
        return paused, False
    if state.current is not None and version <= state.version:
        return paused, False
    if arr.shape != (shape.num_layers, shape.num_slots):
        return paused, False
    adopted, generated = state.current is not None, None
    state.current, state.doc, state.version = arr, doc, max(state.version, version)
    # minInterval counts from the adopted version's publication (a rollback's time)
    with contextlib.suppress(ValueError):
        generated = _ts(str(doc.get("generatedAt") or ""))
    if generated is not None:
        state.published_at = max(state.published_at or 0.0, generated)
    return paused, adopted


def _save_history(owner: Owner, pool: str, state: PoolState, bucket_s: float, now: float) -> str:
    """Store the history the next plan would use; returns a note for the message ('' when fine)."""
    snap = history_store.snapshot(list(state.history.windows), bucket_s, state.history.cursors, now)
    if snap is None:
        return ""
    try:
        rt.kube().apply(history_configmap(owner, pool, history_store.encode(snap)))
    except (ValueError, KubeError) as exc:
        return f"; load history not stored: {exc}"[:300]
    return ""


def _shape(spec: MoEDeploymentSpec, pool_name: str) -> PoolShape | None:
    pool = getattr(spec, pool_name)
    arch = resolve_architecture(spec.model)
    if pool is None or arch is None:
        return None
    layout = pool_layout(pool, spec.topology)
    if not layout.expert_parallel:
        return None
    return PoolShape(
        num_layers=arch.layers,
        num_experts=arch.routed_experts,
        num_redundant=spec.eplb.redundant_experts,
        num_gpus=world_size(pool, spec.topology),
        num_nodes=layout.nodes,
        num_groups=arch.expert_groups,
        dispatch="static",
    )


def _token(namespace: str, name: str) -> str | None:
    secret = rt.kube().get(f"/api/v1/namespaces/{namespace}/secrets/{name}-runtime-token")
    raw = ((secret or {}).get("data") or {}).get("token")
    return base64.b64decode(raw).decode().strip() if raw else None


def _collect(state: PoolState, leaders: list[dict[str, Any]], shape: PoolShape) -> tuple[list[str], int]:
    """Fetch new windows from every leader into the history; returns what failed and how many were new."""
    failed, added = [], 0
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        for pod in leaders:
            key = f"{pod['name']}/{pod['uid']}"
            try:
                after = state.history.cursors.get(key, 0)
                url = f"http://{pod['ip']}:{SIDECAR_PORT}/v1/windows"
                answer = http.get(url, params={"after": after, "counts": "true"}).raise_for_status().json()
                if int(answer.get("latest_seq") or 0) < after:  # the runtime restarted
                    state.history.forget_instance(key)
                    answer = http.get(url, params={"after": 0, "counts": "true"}).raise_for_status().json()
                added += state.history.add(parse_windows(key, answer, (shape.num_layers, shape.num_experts)))
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                failed.append(f"{pod['name']}: {type(exc).__name__}")
    return failed, added


def _push(doc: dict[str, Any], leaders: list[dict[str, Any]], token: str, labels: list[str]) -> list[str]:
    """PUT the placement to every leader; returns the refusals."""
    failed = []
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        for pod in leaders:
            try:
                resp = http.put(
                    f"http://{pod['ip']}:{SIDECAR_PORT}/v1/placement",
                    json=doc,
                    headers={"Authorization": f"Bearer {token}"},
                )
                result = "ok" if resp.status_code == 200 else f"http_{resp.status_code}"
                if resp.status_code != 200:
                    failed.append(f"{pod['name']}: HTTP {resp.status_code} {resp.text[:120]}")
            except httpx.HTTPError as exc:
                result = "unreachable"
                failed.append(f"{pod['name']}: {type(exc).__name__}")
            PUSHES.labels(*labels, result).inc()
    return failed


def _publish(owner: Owner, pool: str, state: PoolState, ev: Evaluation, now: float) -> dict[str, Any]:
    assert ev.candidate is not None
    version = state.version + 1
    doc = document(version, ev.candidate, datetime.fromtimestamp(now, UTC))
    provenance = {
        "windowRange": [_iso(ev.window_range[0]), _iso(ev.window_range[1])],
        "instances": ev.instances,
        "measuredBalancedness": round(ev.measured, 4),
        "predictedBalancedness": round(ev.predicted, 4),
        "movedExperts": ev.moved,
        "historyBuckets": ev.history_buckets,
        "restoredBuckets": ev.restored_buckets,
    }
    kube = rt.kube()
    for obj in configmaps(owner, pool, doc, provenance):
        kube.apply(obj)
    for old in expired_versions(version):
        kube.delete("v1", "ConfigMap", owner.namespace, f"{placement_config_name(owner.name, pool)}-v{old}")
    state.version, state.current, state.doc, state.published_at = version, ev.candidate, doc, now
    return doc


def evaluate_pool(
    body: kopf.Body, spec: MoEDeploymentSpec, pool: str, pods: list[dict[str, Any]], logger: Any
) -> dict[str, Any] | None:
    """One tick for one pool; returns the status.placement.<pool> fields to write, or None."""
    name, namespace = str(body.metadata.name), str(body.metadata.namespace or "")
    shape = _shape(spec, pool)
    eplb = spec.eplb
    if shape is None or eplb.mode == "off":
        return None
    status = dict(((body.get("status") or {}).get("placement") or {}).get(pool) or {})
    with _lock:
        state = _states.setdefault((namespace, name, str(body.metadata.uid), pool), PoolState())
    labels = [namespace, name, pool]
    if not state.loaded:
        _load(state, status, namespace, name, pool, shape)
    now = time.time()
    if state.published_at is not None:
        AGE.labels(*labels).set(now - state.published_at)
    refresh = parse_duration(eplb.refresh_interval)
    # The first evaluation waits one refresh after creation: windows need time to arrive.
    since = state.evaluated_at or _ts(body.metadata.get("creationTimestamp")) or now
    if now - since < refresh:
        return None
    state.evaluated_at = now
    started = time.perf_counter()
    leaders = [p for p in pods if p["pool"] == pool and p["rank"] == 0 and p["ip"] and not p["deleting"]]
    paused, adopted = _sync_live(state, namespace, name, pool, shape)
    if adopted:
        kopf.event(
            body, type="Normal", reason="PlacementAdopted",
            message=f"{pool} v{state.version} was published outside the control loop (a rollback); it is now current",
        )  # fmt: skip
    failed, added = _collect(state, leaders, shape)
    state.history.prune(now, parse_duration(eplb.history))
    owner = Owner(name, namespace, str(body.metadata.uid))
    current = state.current if state.current is not None else trivial_map(*_dims(shape))
    policy = Policy(
        mode=eplb.mode,
        min_improvement=eplb.min_improvement,
        max_moves=eplb.max_moved_experts_per_refresh,
        min_interval_s=parse_duration(eplb.min_interval),
        bucket_s=max(1.0, refresh / 4),
        paused=paused,
    )
    out: dict[str, Any] = {"lastEvaluationTime": _iso(now)}
    if state.doc is not None and status.get("version") != state.version:
        out.update(version=state.version, updateTime=state.doc.get("generatedAt"))
    note = f"; unreachable: {', '.join(failed)}" if failed else ""
    if added:
        note += _save_history(owner, pool, state, policy.bucket_s, now)
    since_publish = None if state.published_at is None else now - state.published_at
    try:
        ev = evaluate(list(state.history.windows), current, shape, policy, since_publish, now - 2 * refresh)
    except (ValueError, IndexError) as exc:
        reason = "no_windows" if "no fresh" in str(exc) else "planner_error"
        SKIPS.labels(*labels, reason).inc()
        FAILURES.labels(*labels, reason).inc()
        out["message"] = f"no new placement: {exc}{note}"[:1024]
        DURATION.labels(*labels).observe(time.perf_counter() - started)
        return out
    BALANCE.labels(*labels, "measured").set(ev.measured)
    BALANCE.labels(*labels, "predicted").set(ev.predicted)
    out["measuredBalancedness"] = round(ev.measured, 3)
    message = ev.decision.message
    if ev.restored_buckets:
        message += (
            f"; planned on {ev.history_buckets} load buckets, {ev.restored_buckets} restored after a restart"
        )
    publish = ev.decision.publish
    if publish:
        # Planning takes seconds: a rollback published meanwhile wins (and numbers stay unique).
        paused_now, adopted_now = _sync_live(state, namespace, name, pool, shape)
        if paused_now or adopted_now:
            publish = False
            message = f"v{state.version} was published meanwhile (rollback); the new plan is dropped"
            out.update(version=state.version, updateTime=(state.doc or {}).get("generatedAt"))
    if publish:
        doc = _publish(owner, pool, state, ev, now)
        REBALANCES.labels(*labels).inc()
        VERSION.labels(*labels).set(state.version)
        out.update(
            version=state.version,
            configMap=placement_config_name(name, pool),
            updateTime=doc["generatedAt"],
            predictedBalancedness=round(min(1.0, ev.predicted), 3),
            movedExperts=ev.moved,
        )
        kopf.event(
            body, type="Normal", reason="PlacementPublished", message=f"{pool} v{state.version}: {message}"
        )
        logger.info(f"{pool}: published placement v{state.version}: {message}")
    else:
        SKIPS.labels(*labels, "preempted" if ev.decision.publish else ev.decision.reason).inc()
    if eplb.mode == "operator" and state.doc is not None and leaders:
        token = _token(namespace, name)
        refused = (
            _push({**state.doc, "generatedAt": _iso(now)}, leaders, token, labels) if token else ["no token"]
        )
        if refused:
            FAILURES.labels(*labels, "push_refused").inc()
            taken = len(leaders) - len(refused) if token else 0
            message += f"; {taken} of {len(leaders)} runtime(s) hold it, push refused: {', '.join(refused)}"
    out["message"] = (message + note)[:1024]
    DURATION.labels(*labels).observe(time.perf_counter() - started)
    return out


def _dims(shape: PoolShape) -> tuple[int, int, int]:
    return shape.num_layers, shape.num_experts, shape.num_slots


def _changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Anything but the evaluation time (and small balancedness jitter) differs."""
    for k, v in new.items():
        if k == "lastEvaluationTime":
            continue
        if k == "measuredBalancedness" and old.get(k) is not None and abs(float(old[k]) - float(v)) < 0.01:
            continue
        if old.get(k) != v:
            return True
    return False


@kopf.timer(GROUP, RESOURCE, interval=TICK_S, initial_delay=TICK_S)
def control_timer(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **kwargs: Any) -> None:
    """Collect -> plan -> decide -> publish for each pool whose refreshInterval has passed."""
    try:
        spec = MoEDeploymentSpec.model_validate(dict(body.spec))
    except ValueError:
        return  # the reconciler reports invalid specs
    key = (body.metadata.namespace, body.metadata.name)
    pods = list(kwargs["engine_pod_index"].get(key, []))
    current = (body.get("status") or {}).get("placement") or {}
    updates: dict[str, Any] = {}
    for pool in ("prefill", "decode"):
        try:
            fields = evaluate_pool(body, spec, pool, pods, logger)
        except (KubeError, httpx.HTTPError) as exc:
            SKIPS.labels(key[0] or "", key[1], pool, "api_error").inc()
            FAILURES.labels(key[0] or "", key[1], pool, "api_error").inc()
            fields = {"message": f"no new placement: {exc}"[:1024]}
        if fields and _changed(dict(current.get(pool) or {}), fields):
            if "message" in fields and fields["message"] != (current.get(pool) or {}).get("message"):
                logging.getLogger(__name__).info(f"{key[1]}/{pool}: {fields['message']}")
            updates[pool] = fields
    if updates:
        patch.status["placement"] = updates


@kopf.on.event(GROUP, RESOURCE)
async def forget_deleted(event: kopf.RawEvent, **_: Any) -> None:
    """Drop a deleted deployment's pool states (kept otherwise for the life of the process)."""
    if event.get("type") == "DELETED":
        uid = str(event["object"]["metadata"].get("uid"))
        with _lock:
            for key in [k for k in _states if k[2] == uid]:
                del _states[key]
