"""The expert-placement control loop: a thin kopf timer around moe_operator.control.

Every TICK_S it looks at each pool of each MoEDeployment; when spec.eplb.refreshInterval has
passed, one evaluation runs these steps:

    restore (after a restart) -> adopt a rollback -> collect windows -> keep history
    -> evaluate (pure: plan, score, decide) -> publish a version -> push it (mode operator)

Failures publish nothing, say why in status.placement.<pool>.message and count a metric.
Status is written only when something besides the evaluation time changed, so an idle or
broken pool costs no API writes after the first report.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import kopf
import numpy as np

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.conditions import Reason
from moe_operator.api.derived import pool_layout, resolve_architecture, world_size
from moe_operator.api.names import GROUP, PLURAL
from moe_operator.api.types import parse_duration
from moe_operator.autoscale import codec
from moe_operator.control import history_store
from moe_operator.control.client import Pushed, RuntimeAnswerError, RuntimeClient
from moe_operator.control.decide import static_roll
from moe_operator.control.evaluate import Evaluation, NoFreshWindows, Policy, PoolShape, evaluate
from moe_operator.control.instances import (
    MAX_STATUS_INSTANCES,
    Held,
    PoolEvaluation,
    current_of,
    evaluate_instances,
    next_version,
    plan_requests,
    provenance,
    push_version,
    read_held,
)
from moe_operator.control.live import StoredPlacement, read_stored
from moe_operator.control.publish import (
    KEEP_VERSIONS,
    configmaps,
    expired_versions,
    history_configmap,
    history_name,
    version_name,
)
from moe_operator.control.windows import Window, parse_windows
from moe_operator.handlers.kube import KubeError
from moe_operator.handlers.runtime_planning import gather_proposals, planned_here
from moe_operator.handlers.runtime_tokens import leader_tokens
from moe_operator.handlers.state import InstanceMemo, OperatorState, PoolState, operator_of
from moe_operator.handlers.widths import running_spec
from moe_operator.reconcile.observe import trusted_pods
from moe_operator.render.group import Owner, placement_config_name
from moe_placement import document
from moe_placement.maps import trivial_map

TICK_S = 5.0


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Tick:
    """One evaluation of one pool."""

    op: OperatorState
    body: kopf.Body
    spec: MoEDeploymentSpec
    pool: str
    shape: PoolShape
    state: PoolState
    status: dict[str, Any]  # status.placement.<pool> as last written
    now: float

    @property
    def owner(self) -> Owner:
        meta = self.body.metadata
        return Owner(str(meta.name), str(meta.namespace or ""), str(meta.uid))

    @property
    def labels(self) -> tuple[str, str, str]:
        return (self.owner.namespace, self.owner.name, self.pool)

    def count(self, metric: str, *extra: str, amount: int = 1) -> None:
        if amount:
            self.op.metrics.counter(metric, *self.labels, *extra).inc(amount)

    def event(self, reason: Reason, message: str) -> None:
        kopf.event(self.body, type="Normal", reason=reason, message=message)


def pool_shape(spec: MoEDeploymentSpec, pool_name: str) -> PoolShape | None:
    """The pool's EP world and model, or None when it has no experts to place."""
    pool = spec.prefill if pool_name == "prefill" else spec.decode
    arch = resolve_architecture(spec.model)
    if pool is None or arch is None or spec.eplb.mode == "off":
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


def restore(t: Tick) -> None:
    """After a restart: versions from status, the load history from its own ConfigMap."""
    s = t.state
    s.loaded = True
    s.version = int(t.status.get("version") or 0)
    s.published_at = _ts(t.status.get("updateTime"))
    s.evaluated_at = _ts(t.status.get("lastEvaluationTime"))
    stored = t.op.kube.get(
        f"/api/v1/namespaces/{t.owner.namespace}/configmaps/{history_name(t.owner.name, t.pool)}"
    )
    text = ((stored or {}).get("data") or {}).get(history_store.KEY)
    snap = history_store.decode(text, (t.shape.num_layers, t.shape.num_experts)) if text else None
    if snap is not None:
        s.history.restore(history_store.restored_windows(snap), snap.cursors)
        s.restored_buckets = len(snap.keys)


def adopt_live(t: Tick) -> str:
    """Read the live ConfigMap; adopt a newer, valid version published outside the loop (a rollback,
    or the first read after a start). Returns the pause reason ('' when not paused). A version that
    breaks the document's bounds or the map rules is never adopted: an event says why and the last
    good map stays current (after a restart: the newest valid kept copy)."""
    cm = t.op.kube.get(_cm_path(t, placement_config_name(t.owner.name, t.pool)))
    if not cm:
        return ""
    s, live = t.state, read_stored(cm, t.shape, t.now)
    if s.current is not None and live.version is not None and live.version <= s.version:
        return live.paused
    if live.phy2log is None and live.other_shape and live.version is not None and live.version <= s.version:
        note_other_shape(t, live)  # a version the loop knows, placed for the pool's earlier shape
        return live.paused
    if live.phy2log is None:
        refuse(t, live)
        live = newest_kept(t) if s.current is None else live
        if live.phy2log is None:
            return live.paused
    adopted = s.current is not None
    assert live.version is not None
    s.current, s.doc, s.version = live.phy2log, live.doc, max(s.version, live.version)
    if live.generated_at is not None:  # minInterval counts from the adopted version's publication
        s.published_at = max(s.published_at or 0.0, live.generated_at)
    if adopted:
        t.event(Reason.PLACEMENT_ADOPTED,
                f"{t.pool} v{s.version} was published outside the control loop (a rollback); it is now current")  # fmt: skip
    return live.paused


def refuse(t: Tick, live: StoredPlacement) -> None:
    """One warning event (and a metric) per refused version of the live ConfigMap."""
    key = f"{live.version}: {live.problems[:1]}"
    if t.state.refused == key:
        return
    t.state.refused = key
    t.count("moe_operator_rebalance_failures_total", "configmap_refused")
    kopf.event(t.body, type="Warning", reason=Reason.PLACEMENT_REFUSED,
               message=f"{t.pool}: the live placement ConfigMap is not a valid placement "
               f"({'; '.join(live.problems[:2])}); keeping v{t.state.version}")  # fmt: skip


def note_other_shape(t: Tick, live: StoredPlacement) -> None:
    """One event per version placed for the pool's earlier shape: expected after a shape change."""
    key = f"{live.version}: another shape"
    if t.state.refused == key:
        return
    t.state.refused = key
    t.event(Reason.PLACEMENT_SHAPE_CHANGED,
            f"{t.pool}: v{live.version} was placed for another pool shape; the pool now has "
            f"{t.shape.num_slots} expert slots per layer on {t.shape.num_gpus} GPUs and plans for them afresh"
            + (f" once its placement is no longer paused ({live.paused})" if live.paused else ""))  # fmt: skip


def start_over_on_new_shape(t: Tick) -> None:
    """spec.eplb.redundantExperts or the width changed: a map of the earlier shape is no current
    map (the planner would refuse it at every evaluation). The pool plans afresh under the next
    version; its load history counts logical experts and stays."""
    s = t.state
    if s.current is not None and t.shape.problems(s.current):
        s.current, s.doc, s.instances = None, None, {}


def newest_kept(t: Tick) -> StoredPlacement:
    """After a restart with a broken live ConfigMap: the newest valid of the kept versioned copies."""
    newest = int(t.status.get("version") or 0)
    for version in range(newest, max(newest - KEEP_VERSIONS, 0), -1):
        cm = t.op.kube.get(_cm_path(t, version_name(t.owner.name, t.pool, version)))
        kept = read_stored(cm, t.shape, t.now) if cm else None
        if kept is not None and kept.phy2log is not None and kept.version == version:
            return kept
    return StoredPlacement(None, None)


def _cm_path(t: Tick, name: str) -> str:
    return f"/api/v1/namespaces/{t.owner.namespace}/configmaps/{name}"


def collect(t: Tick, client: RuntimeClient, leaders: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Fetch new windows from every leader at once into the history; returns what failed and how many
    were new. Each answer is bounded in bytes and time, so a slow or huge one delays only itself,
    and parsed as it arrives (the answers' bodies are never all held at once)."""
    history = t.state.history
    cursors = {f"{p['name']}/{p['uid']}": history.cursors.get(f"{p['name']}/{p['uid']}", 0) for p in leaders}
    shape = (t.shape.num_layers, t.shape.num_experts)

    def fetch(pod: dict[str, Any]) -> tuple[str, list[Window] | None, bool, str | None]:
        key = f"{pod['name']}/{pod['uid']}"
        try:
            answer = client.windows(pod["ip"], cursors[key])
            if int(answer.get("latest_seq") or 0) < cursors[key]:  # the runtime restarted
                return key, parse_windows(key, client.windows(pod["ip"], 0), shape), True, None
            return key, parse_windows(key, answer, shape), False, None
        except (RuntimeAnswerError, ValueError, TypeError, OverflowError) as exc:  # int(1e400)
            return key, None, False, f"{pod['name']}: {exc or type(exc).__name__}"[:120]

    failed, added = [], 0
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(leaders)))) as pool:
        results = list(pool.map(fetch, leaders))
    for key, windows, restarted, error in results:
        if windows is None:
            failed.append(error or key)
            continue
        if restarted:
            history.forget_instance(key)
        added += history.add(windows)
    return failed, added


def keep_history(t: Tick, bucket_s: float, added: int) -> str:
    """Prune to spec.eplb.history and store what the next plan would use; a note for the message."""
    t.state.history.prune(t.now, parse_duration(t.spec.eplb.history))
    if not added:
        return ""
    snap = history_store.snapshot(list(t.state.history.windows), bucket_s, t.state.history.cursors, t.now)
    if snap is None:
        return ""
    try:
        t.op.kube.apply(history_configmap(t.owner, t.pool, history_store.encode(snap)))
    except (ValueError, KeyError, KubeError) as exc:
        return f"; load history not stored: {exc}"[:300]
    return ""


def publish(t: Tick, ev: Evaluation) -> dict[str, Any]:
    """A new version of the pool's one map (modes static and engine's observe never push it)."""
    assert ev.candidate is not None
    provenance = {
        "windowRange": [_iso(ev.window_range[0]), _iso(ev.window_range[1])],
        "instances": ev.instances,
        "measuredBalancedness": round(ev.measured, 4),
        "predictedBalancedness": round(ev.predicted, 4),
        "movedExperts": ev.moved,
        "historyBuckets": ev.history_buckets,
        "restoredBuckets": ev.restored_buckets,
    }
    out = publish_version(t, t.state.version + 1, ev.candidate, provenance)
    return {**out, "predictedBalancedness": round(min(1.0, ev.predicted), 3), "movedExperts": ev.moved}


def publish_version(t: Tick, version: int, phy2log: Any, provenance: dict[str, Any]) -> dict[str, Any]:
    """The versioned copy, then the live ConfigMap; the oldest copy is dropped."""
    s = t.state
    doc = document.render(version, phy2log, datetime.fromtimestamp(t.now, UTC))
    for obj in configmaps(t.owner, t.pool, doc, provenance):
        t.op.kube.apply(obj)
    for old in expired_versions(version):
        t.op.kube.delete(
            "v1", "ConfigMap", t.owner.namespace, f"{placement_config_name(t.owner.name, t.pool)}-v{old}"
        )
    s.version, s.current, s.doc, s.published_at = version, np.asarray(phy2log), doc, t.now
    t.op.metrics.gauge("moe_operator_placement_version", *t.labels).set(version)
    t.count("moe_operator_rebalances_total")
    return {
        "version": version,
        "configMap": placement_config_name(t.owner.name, t.pool),
        "updateTime": doc["generatedAt"],
    }


def evaluate_pool(
    t: Tick, leaders: list[dict[str, Any]], logger: Any, boots: Mapping[str, str]
) -> dict[str, Any] | None:
    """One tick for one pool, in named steps; returns the status.placement.<pool> fields to write.
    ``boots``: each instance's leader pod (booting ones too) -> the placement version it booted with."""
    s, eplb = t.state, t.spec.eplb
    if not s.loaded:
        restore(t)
    if s.published_at is not None:
        t.op.metrics.gauge("moe_operator_placement_age_seconds", *t.labels).set(t.now - s.published_at)
    refresh = parse_duration(eplb.refresh_interval)
    # The first evaluation waits one refresh after creation: windows need time to arrive.
    since = s.evaluated_at or _ts(t.body.metadata.get("creationTimestamp")) or t.now
    if t.now - since < refresh:
        return None
    s.evaluated_at = t.now
    started = time.perf_counter()
    out: dict[str, Any] = {"lastEvaluationTime": _iso(t.now)}
    start_over_on_new_shape(t)
    paused = adopt_live(t)
    if s.doc is not None and t.status.get("version") != s.version:
        out.update(version=s.version, updateTime=s.doc.get("generatedAt"))
    policy = Policy(
        mode=eplb.mode, min_improvement=eplb.min_improvement, max_moves=eplb.max_moved_experts_per_refresh,
        min_interval_s=parse_duration(eplb.min_interval), bucket_s=max(1.0, refresh / 4), paused=paused,
        rolling=still_rolling(t, boots) if eplb.mode == "static" else "",
    )  # fmt: skip
    with RuntimeClient(leader_tokens(t.op, t.owner, leaders)) as client:
        failed, added = collect(t, client, leaders)
        note = (f"; unreachable: {', '.join(failed)}" if failed else "") + keep_history(
            t, policy.bucket_s, added
        )
        if eplb.mode == "operator":  # one placement per instance (docs/placement.md, "Cluster level")
            out.update(per_instance(t, policy, refresh, client, leaders, note))
        else:
            fields, _ = decide_and_publish(t, policy, refresh)
            out.update(fields, message=(fields["message"] + note)[:1024])
    t.op.metrics.histogram("moe_operator_placement_evaluation_seconds", *t.labels).observe(
        time.perf_counter() - started
    )
    if out.get("version") and "configMap" in out:
        logger.info(f"{t.pool}: published placement v{out['version']}: {out['message']}")
    return out


def still_rolling(t: Tick, boots: Mapping[str, str]) -> str:
    """Mode static: what of the pool has not rolled onto the version the reconciler renders (the
    status's, not this process's memory of its last publish) or onto the current pod template."""
    try:
        live = int(t.status.get("version") or 0)
    except (TypeError, ValueError, OverflowError):
        live = 0
    status = t.body.get("status") or {}
    return static_roll(live, boots, codec.read_indexes(status, t.pool, "outdated"))


def decide_and_publish(t: Tick, policy: Policy, refresh: float) -> tuple[dict[str, Any], bool]:
    """Evaluate the history against the current map; publish when the decision says so. The flag
    is False when there was nothing to evaluate (or the planner failed): then nothing is pushed."""
    s, shape = t.state, t.shape
    current = (
        s.current
        if s.current is not None
        else trivial_map(shape.num_layers, shape.num_experts, shape.num_slots)
    )
    since_publish = None if s.published_at is None else t.now - s.published_at
    try:
        ev = evaluate(list(s.history.windows), current, shape, policy, since_publish, t.now - 2 * refresh)
    except (ValueError, IndexError) as exc:
        reason = "no_windows" if isinstance(exc, NoFreshWindows) else "planner_error"
        t.count("moe_operator_placement_skips_total", reason)
        t.count("moe_operator_rebalance_failures_total", reason)
        return {"message": f"no new placement: {exc}"}, False
    t.op.metrics.gauge("moe_operator_placement_balancedness", *t.labels, "measured").set(ev.measured)
    t.op.metrics.gauge("moe_operator_placement_balancedness", *t.labels, "predicted").set(ev.predicted)
    out: dict[str, Any] = {"measuredBalancedness": round(ev.measured, 3)}
    message = ev.decision.message
    if ev.restored_buckets:
        message += (
            f"; planned on {ev.history_buckets} load buckets, {ev.restored_buckets} restored after a restart"
        )
    if not ev.decision.publish:
        t.count("moe_operator_placement_skips_total", ev.decision.reason)
        return {**out, "message": message}, True
    # Planning takes seconds: a rollback published meanwhile wins (and numbers stay unique).
    before = s.version
    if adopt_live(t) or s.version != before:
        t.count("moe_operator_placement_skips_total", "preempted")
        message = f"v{s.version} was published meanwhile (rollback); the new plan is dropped"
        return {
            **out,
            "version": s.version,
            "updateTime": (s.doc or {}).get("generatedAt"),
            "message": message,
        }, True
    out.update(publish(t, ev))
    t.event(Reason.PLACEMENT_PUBLISHED, f"{t.pool} v{s.version}: {message}")
    return {**out, "message": message}, True


def read_holdings(t: Tick, client: RuntimeClient, leaders: list[dict[str, Any]]) -> dict[str, Held]:
    """What every leader's runtime holds (GET /v1/placement, at once): the operator's own memory
    of what it pushed does not survive its restart, nor a pod's. A runtime that does not answer
    is left out: its map is unknown, so it is neither planned nor pushed (collect names it)."""

    def fetch(pod: dict[str, Any]) -> tuple[str, Held | None]:
        try:
            return str(pod["name"]), read_held(client.placement(pod["ip"]), t.shape, t.now)
        except RuntimeAnswerError:
            return str(pod["name"]), None  # unknown: neither planned nor pushed this time

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(leaders)))) as pool:
        answers = list(pool.map(fetch, leaders))
    return {name: h for name, h in answers if h is not None}


def since_change(t: Tick, name: str) -> float | None:
    """Seconds since this loop last changed the instance's map (after a restart: since the pool's
    last publication, which is never later), None when never."""
    memo = t.state.instances.get(name)
    at = memo.changed_at if memo is not None and memo.changed_at is not None else t.state.published_at
    return None if at is None else t.now - at


def per_instance(
    t: Tick, policy: Policy, refresh: float, client: RuntimeClient, leaders: list[dict[str, Any]], note: str
) -> dict[str, Any]:
    """eplb mode operator: plan and decide each instance on its own windows, publish one pool
    version when any changes, push every instance its own map; the status.placement fields."""
    s, shape = t.state, t.shape
    held = read_holdings(t, client, leaders)
    live = live_map(t)
    currents = {n: current_of(h, live, s.version)[0] for n, h in held.items()}
    s.instances = {str(p["name"]): s.instances.get(str(p["name"])) or InstanceMemo() for p in leaders}
    fresh_after = t.now - 2 * refresh
    proposals = runtime_proposals(t, policy, client, leaders, currents, fresh_after)
    note += planned_here(proposals[1])
    try:
        ev = evaluate_instances(list(s.history.windows), currents, live, shape, policy,
                                {n: since_change(t, n) for n in held}, fresh_after, proposals[0])  # fmt: skip
    except (ValueError, IndexError) as exc:
        reason = "no_windows" if isinstance(exc, NoFreshWindows) else "planner_error"
        t.count("moe_operator_placement_skips_total", reason)
        t.count("moe_operator_rebalance_failures_total", reason)
        return {"message": f"no new placement: {exc}{note}"[:1024], "instances": instance_status(t)}
    out, targets = decide_instances(t, ev, held, currents)
    pushed = push_each(t, client, leaders, targets)
    out["message"] = (out.get("message", head_of(ev)) + note + pushed + ": " + ev.details())[:1024]
    out["instances"] = instance_status(t)
    return out


def runtime_proposals(
    t: Tick, policy: Policy, client: RuntimeClient, leaders: list[dict[str, Any]],
    currents: dict[str, np.ndarray], fresh_after: float,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:  # fmt: skip
    """With --planning runtimes: the maps the instances' runtimes propose, and why the others did not."""
    if t.op.planning != "runtimes" or not client.has_token:
        return {}, {}
    request = f"v{t.state.version}-{int(t.now * 1000)}"
    requests = plan_requests(list(t.state.history.windows), currents, t.shape, policy, fresh_after, request)
    proposals, missing = gather_proposals(client, leaders, requests)
    t.count("moe_operator_runtime_plans_total", "proposed", amount=len(proposals))
    t.count("moe_operator_runtime_plans_total", "missing", amount=len(missing))
    return proposals, missing


def head_of(ev: PoolEvaluation) -> str:
    """The start of the status message: what happened, and how much history the plans used."""
    head = ev.head()
    if ev.restored_buckets:
        head += (
            f"; planned on {ev.history_buckets} load buckets, {ev.restored_buckets} restored after a restart"
        )
    return head


def decide_instances(
    t: Tick, ev: PoolEvaluation, held: dict[str, Held], currents: dict[str, np.ndarray]
) -> tuple[dict[str, Any], dict[str, tuple[int, np.ndarray]]]:
    """Record the evaluation, publish a pool version when any instance changes; the status fields
    and, per instance, the (version, map) to push."""
    s = t.state
    t.op.metrics.gauge("moe_operator_placement_balancedness", *t.labels, "measured").set(ev.measured)
    t.op.metrics.gauge("moe_operator_placement_balancedness", *t.labels, "predicted").set(ev.predicted)
    for r in ev.results.values():
        s.instances[r.name].measured = r.measured
    out: dict[str, Any] = {"measuredBalancedness": round(ev.measured, 3)}
    if ev.publish and preempted(t):
        out["message"] = f"v{s.version} was published meanwhile (rollback); the new plans are dropped"
    elif ev.publish:
        version = next_version(s.version, held)
        assert ev.pool_candidate is not None
        prov = {"pool": "plan on the pool's summed windows", "historyBuckets": ev.history_buckets,
                "restoredBuckets": ev.restored_buckets, "measuredBalancedness": round(ev.measured, 4),
                "predictedBalancedness": round(ev.predicted, 4), "movedExperts": ev.moved,
                "instances": provenance(ev, version)}  # fmt: skip
        out.update(publish_version(t, version, ev.pool_candidate, prov))
        out.update(predictedBalancedness=round(min(1.0, ev.predicted), 3), movedExperts=ev.moved)
        for r in ev.changed:
            s.instances[r.name].changed_at, s.instances[r.name].predicted = t.now, r.predicted
        t.event(Reason.PLACEMENT_PUBLISHED, f"{t.pool} v{version}: {ev.message()}"[:1024])
        return out, {n: (version, ev.results[n].target if n in ev.results else currents[n]) for n in held}
    if not ev.publish:
        reasons = Counter(r.decision.reason for r in ev.results.values())
        t.count("moe_operator_placement_skips_total", reasons.most_common(1)[0][0])
    if s.doc is not None and t.status.get("version") != s.version:
        out.update(version=s.version, updateTime=s.doc.get("generatedAt"))
    live = live_map(t)  # a rollback adopted meanwhile is the live map now
    return out, {n: (push_version(s.version, h), current_of(h, live, s.version)[0]) for n, h in held.items()}


def live_map(t: Tick) -> np.ndarray:
    """The live ConfigMap's map (SGLang's trivial one before the first version)."""
    shape = t.shape
    if t.state.current is not None:
        return t.state.current
    return trivial_map(shape.num_layers, shape.num_experts, shape.num_slots)


def preempted(t: Tick) -> bool:
    """Planning takes seconds: a rollback published meanwhile wins (and numbers stay unique)."""
    before = t.state.version
    if adopt_live(t) or t.state.version != before:
        t.count("moe_operator_placement_skips_total", "preempted")
        return True
    return False


def push_each(
    t: Tick, client: RuntimeClient, leaders: list[dict[str, Any]], targets: dict[str, tuple[int, np.ndarray]]
) -> str:
    """PUT each leader its own (version, map), at once; a note for the message. Version 0 (nothing
    ever published) is not pushed: the runtime then keeps what its engine chose."""
    todo = [p for p in leaders if targets.get(str(p["name"]), (0, None))[0] > 0]
    if not todo:
        return ""
    if not client.has_token:
        t.count("moe_operator_rebalance_failures_total", "push_refused")
        return f"; 0 of {len(todo)} runtime(s) hold it, push refused: no token"
    stamp = datetime.fromtimestamp(t.now, UTC)

    def put(pod: dict[str, Any]) -> tuple[str, int, Pushed]:
        version, phy2log = targets[str(pod["name"])]
        return str(pod["name"]), version, client.push(pod["ip"], document.render(version, phy2log, stamp))

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(todo)))) as pool:
        results = list(pool.map(put, todo))
    refused = []
    for name, version, pushed in results:
        t.count("moe_operator_placement_pushes_total", pushed.result)
        if pushed.refusal is None:
            t.state.instances.setdefault(name, InstanceMemo()).version = version
        else:
            refused.append(f"{name}: {pushed.refusal}")
    if not refused:
        return ""
    t.count("moe_operator_rebalance_failures_total", "push_refused")
    return (
        f"; {len(todo) - len(refused)} of {len(todo)} runtime(s) hold it, push refused: {', '.join(refused)}"
    )


def instance_status(t: Tick) -> list[dict[str, Any]]:
    """status.placement.<pool>.instances: bounded, rounded (so noise does not rewrite status)."""
    rows = []
    for name, m in sorted(t.state.instances.items())[:MAX_STATUS_INSTANCES]:
        row: dict[str, Any] = {"name": name, "version": m.version}
        if m.measured is not None:
            row["measuredBalancedness"] = round(min(1.0, m.measured), 2)
        if m.predicted is not None:
            row["predictedBalancedness"] = round(min(1.0, m.predicted), 3)
        rows.append(row)
    return rows


def _changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Anything but the evaluation time (and small balancedness jitter) differs."""
    for k, v in new.items():
        if k == "lastEvaluationTime":
            continue
        if k == "measuredBalancedness" and old.get(k) is not None and abs(float(old[k]) - float(v)) < 0.01:
            continue
        if k == "instances" and _same_instances(old.get(k) or [], v):
            continue
        if old.get(k) != v:
            return True
    return False


def _same_instances(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    """The same instances and versions, and each measured balancedness within 0.02."""
    if [{**o, "measuredBalancedness": None} for o in old] != [
        {**n, "measuredBalancedness": None} for n in new
    ]:
        return False
    return all(
        abs(float(o.get("measuredBalancedness") or 0) - float(n.get("measuredBalancedness") or 0)) < 0.02
        for o, n in zip(old, new, strict=True)
    )


@kopf.timer(GROUP, PLURAL, interval=TICK_S, initial_delay=TICK_S)
def control_timer(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: Any, **kwargs: Any) -> None:
    """Collect -> plan -> decide -> publish for each pool whose refreshInterval has passed."""
    try:
        spec = MoEDeploymentSpec.model_validate(dict(body.spec))
    except ValueError:
        return  # the reconciler reports invalid specs
    op = operator_of(memo)
    namespace, name = str(body.metadata.namespace or ""), str(body.metadata.name)
    spec = running_spec(spec, dict(body.spec), dict(body.get("status") or {}), op.platform, namespace)
    key = (namespace, name)
    groups = [*kwargs["statefulset_index"].get(key, []), *kwargs["leaderworkerset_index"].get(key, [])]
    pods = trusted_pods(kwargs["engine_pod_index"].get(key, []), groups, name)
    current = (body.get("status") or {}).get("placement") or {}
    updates: dict[str, Any] = {}
    for pool in ("prefill", "decode"):
        shape = pool_shape(spec, pool)
        if shape is None:
            continue
        state = op.deployment(str(body.metadata.uid)).pools.setdefault(pool, PoolState())
        t = Tick(op, body, spec, pool, shape, state, dict(current.get(pool) or {}), time.time())
        heads = [p for p in pods if p["pool"] == pool and p["rank"] == 0 and not p["deleting"]]
        leaders = [p for p in heads if p["ip"]]
        try:
            fields = evaluate_pool(t, leaders, logger, {p["name"]: p.get("bootPlacement", "") for p in heads})
        except (KubeError, httpx.HTTPError) as exc:
            t.count("moe_operator_placement_skips_total", "api_error")
            t.count("moe_operator_rebalance_failures_total", "api_error")
            fields = {"message": f"no new placement: {exc}"[:1024]}
        if fields and _changed(t.status, fields):
            if "message" in fields and fields["message"] != t.status.get("message"):
                logging.getLogger(__name__).info(f"{name}/{pool}: {fields['message']}")
            updates[pool] = fields
    if updates:
        patch.status["placement"] = updates
