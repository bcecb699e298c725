"""The MoEDeployment reconciler: a thin kopf shell around plan -> render -> apply.

Level-based: the same function runs on create/update/resume and on a short timer, reads
only kopf indexes, writes only what differs (by content hash), and never writes status
that did not change. Spec problems (the webhook fails open) stop the reconcile without
touching anything already running.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any, Literal

import kopf
from pydantic import ValidationError

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.conditions import Reason, set_condition
from moe_operator.handlers import runtime as rt
from moe_operator.handlers.indexes import MANAGED, leaderworkerset_served
from moe_operator.handlers.kube import KubeError
from moe_operator.handlers.observe import (
    compute_status,
    group_states,
    node_snapshot,
    previous_placements,
    status_changed,
)
from moe_operator.handlers.status_metrics import export_status
from moe_operator.handlers.wakeups import Wakeups
from moe_operator.lifecycle import GroupState, decide, formed, pool_may_roll, restarts_after
from moe_operator.render import labels as L
from moe_operator.render.children import (
    LeaderWorkerSetState,
    placement_versions,
    recorded_group_backend,
    render_children,
    resolve_group_backend,
)
from moe_operator.render.group import LWS_API_VERSION, GroupBackend, Owner
from moe_operator.render.shared import token_secret
from moe_operator.topology.planner import plan_topology
from moe_operator.topology.requests import pool_requests, topology_policy
from moe_operator.validation import validate

GROUP = "moe.inference.dev"
RESOURCE = "moedeployments"
RECONCILE_INTERVAL_S = 5.0  # every deployment is reconciled at least this often
WAKE_INTERVAL_S = 1.0  # deployments whose children changed are reconciled within about this
LIFECYCLE_MANAGER = "moe-operator-groups"

wakeups = Wakeups(RECONCILE_INTERVAL_S)
_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
# (namespace, kind, name) -> (spec hash, 30 s epoch) of the last apply: bridges the watch lag
# so a burst of reconciles does not re-apply objects the index has not seen yet.
_recently_applied: dict[tuple[str, str, str], tuple[str, int]] = {}
APPLY_GRACE_S = 30


# deployment uid -> {node: GPUs} its current plan holds; one operator process plans all
# deployments, so this is exact for plans whose pods the watch has not delivered yet.
_claims: dict[str, dict[str, int]] = {}
_plan_lock = threading.Lock()
_tokens_present: set[str] = set()  # deployment uids whose runtime-token Secret exists


def _claims_of_others(uid: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for owner, nodes in list(_claims.items()):
        if owner != uid:
            for node, gpus in nodes.items():
                out[node] = out.get(node, 0) + gpus
    return out


def _applied_epoch(now: datetime) -> int:
    return int(now.timestamp() // APPLY_GRACE_S)


def _children(indexes: dict[str, Any], key: tuple[str, str]) -> list[dict[str, Any]]:
    from moe_operator.handlers.indexes import CHILD_INDEXES

    out: list[dict[str, Any]] = []
    for index_name in CHILD_INDEXES:
        out += list(indexes[index_name].get(key, []))
    return out


def reconcile(
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    indexes: dict[str, Any],
) -> None:
    """Reconcile one MoEDeployment; a namespace being deleted ends it quietly (nothing to retry)."""
    if body.metadata.get("deletionTimestamp"):
        _claims.pop(str(body.metadata.uid), None)
        return  # garbage collection removes the children
    try:
        _reconcile(body, patch, logger, indexes)
    except KubeError as exc:
        if exc.status in (403, 404) and "namespace" in str(exc):
            logger.debug(f"namespace going away, skipping: {exc}")
            return
        raise


def _reconcile(
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | kopf.Logger,
    indexes: dict[str, Any],
) -> None:
    name, namespace = str(body.metadata.name), str(body.metadata.namespace or "")
    uid = body.metadata.uid
    generation = int(body.metadata.get("generation") or 0)
    current_status = dict(body.get("status") or {})
    now = datetime.now(UTC)
    with _locks[(namespace, name)]:
        try:
            spec = MoEDeploymentSpec.model_validate(dict(body.spec))
            problems = validate(dict(body.spec), None)
        except ValidationError as exc:
            problems = [type("P", (), {"field": "spec", "message": str(exc)})()]  # pragma: no cover
        if problems:
            message = "; ".join(f"{p.field}: {p.message}" for p in problems)[:4000]
            _stop(body, patch, current_status, "InvalidSpec", message, generation, now)
            return
        served = leaderworkerset_served(indexes["leaderworkerset_api_index"])
        lws_state: LeaderWorkerSetState = (
            "absent" if not served else "served" if rt.leaderworkerset_watched() else "unwatched"
        )
        backend = resolve_group_backend(
            spec.topology.group_backend, recorded_group_backend(current_status), lws_state
        )
        if backend is None:
            if lws_state == "unwatched":
                reason = Reason.LEADERWORKERSET_NOT_WATCHED
                message = (
                    "LeaderWorkerSet was installed after the operator started, so the operator does "
                    "not watch LeaderWorkerSets yet: restart the operator (for example kubectl -n "
                    "moe-system rollout restart deployment/moe-operator)"
                )
            else:
                reason = Reason.LEADERWORKERSET_NOT_INSTALLED
                message = (
                    "the instances are to run as LeaderWorkerSets (spec.topology.groupBackend "
                    f"{spec.topology.group_backend}), but the cluster does not serve "
                    "leaderworkerset.x-k8s.io/v1: install the LeaderWorkerSet controller, or set "
                    "spec.topology.groupBackend to StatefulSet (that replaces every running instance)"
                )
            _stop(body, patch, current_status, reason, message, generation, now)
            return

        key = (namespace, name)
        owner = Owner(name=name, namespace=namespace, uid=uid)
        children = _children(indexes, key)
        group_objects = [c for c in children if c["kind"] == backend]
        # Snapshot, plan and claim under one process-wide lock: two deployments planned at once
        # would otherwise both take the same free nodes, and the loser would move (and restart)
        # on its next reconcile.
        with _plan_lock:
            nodes = node_snapshot(
                [v for vals in indexes["node_index"].values() for v in vals],
                {node: list(vals) for node, vals in indexes["gpu_use_index"].items()},
                uid,
                _claims_of_others(uid),
            )
            plan = plan_topology(
                pool_requests(spec), nodes, topology_policy(spec), previous_placements(group_objects, name)
            )
            _claims[uid] = {n: spec.topology.gpus_per_node for p in plan.placements for n in p.nodes}
        kube = rt.kube()

        # The runtime token: created once, kept across reconciles and operator restarts. Looked up
        # once per deployment and process rather than watched: the operator needs no cluster-wide
        # list/watch on Secrets.
        if uid not in _tokens_present:
            # A deployment never reconciled has no token yet: create it without looking first
            # (create leaves an existing one alone).
            never_reconciled = "observedGeneration" not in current_status
            if (
                never_reconciled
                or kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}-runtime-token") is None
            ):
                kube.create(token_secret(owner, secrets.token_urlsafe(32)))
            _tokens_present.add(uid)

        desired = render_children(
            spec, owner, plan, rt.settings(), placement_versions(current_status), backend
        )
        observed = {(c["kind"], c["name"]): c for c in children}
        stale: list[dict[str, Any]] = []
        for obj in desired:
            child_key = (obj["kind"], obj["metadata"]["name"])
            want = obj["metadata"]["annotations"][L.SPEC_HASH]
            have = observed.get(child_key)
            if have is not None and have["specHash"] == want:
                continue
            if have is None and _recently_applied.get((namespace, *child_key)) == (want, _applied_epoch(now)):
                continue  # applied moments ago; the watch has not delivered it to the index yet
            stale.append(obj)
        pods = list(indexes["engine_pod_index"].get(key, []))
        # A LeaderWorkerSet recreates its group as soon as its template changes: such changes to
        # running instances wait here until the lifecycle below lets that instance roll.
        held = {o["metadata"]["name"]: o for o in stale if _template_change_of_running(o, observed, pods)}
        for obj in kube.apply_in_waves([o for o in stale if o["metadata"]["name"] not in held]):
            _remember_applied(namespace, obj, now)
            logger.info(f"applied {obj['kind']} {obj['metadata']['name']}")
        wanted = {(o["kind"], o["metadata"]["name"]) for o in desired}
        for (kind, child), c in observed.items():
            # Only objects this reconciler rendered (they carry a spec hash) are pruned.
            if c["specHash"] and (kind, child) not in wanted:
                kube.delete(_api_version(kind), kind, namespace, child)
                logger.info(f"deleted {kind} {child}: no longer in the plan")

        # Group semantics: restart broken instances whole; roll spec changes one at a time.
        desired_hashes = {
            o["metadata"]["name"]: o["metadata"]["annotations"][L.TEMPLATE_HASH]
            for o in desired
            if o["kind"] == backend
        }
        groups = group_states(spec, name, group_objects, pods, plan, desired_hashes)
        restarting: dict[tuple[str, int], tuple[str, str]] = {}
        emitted: set[tuple[str, str]] = set()  # (reason, message) of events posted by this reconcile
        for pool in {g.pool for g in groups}:
            mine = [g for g in groups if g.pool == pool]
            may_roll = pool_may_roll(mine)
            for g in sorted(mine, key=lambda g: g.index):
                decision = decide(g, now, may_roll)
                if decision.action == "none":
                    continue
                restarting[(g.pool, g.index)] = (decision.reason, decision.message)
                if decision.action == "restart":
                    count = restarts_after(g, now) if decision.reason != "RollingOut" else g.restarts
                    annotations = {
                        L.GROUP_EPOCH: now.isoformat(),
                        L.GROUP_RESTARTS: str(count),
                        L.GROUP_MEMBERS: "",
                    }
                    kube.merge_patch(
                        _group_path(namespace, name, g, backend),
                        {"metadata": {"annotations": annotations}},
                        LIFECYCLE_MANAGER,
                    )
                    # Pods on a Node that no longer exists: no kubelet will ever confirm a graceful
                    # delete, and their names block the StatefulSet until pod GC runs (~40 s+).
                    for pod in g.pods:
                        if pod.node and pod.node not in indexes["node_index"]:
                            kube.delete_pod(namespace, pod.name, grace_period_s=0)
                    instance = L.instance_name(name, g.pool, g.index)
                    if instance in held:
                        # The LeaderWorkerSet controller recreates the group on the new template.
                        kube.apply(held[instance])
                        _remember_applied(namespace, held[instance], now)
                        logger.info(f"applied LeaderWorkerSet {instance}")
                    else:
                        kube.delete_pods(namespace, L.instance_selector(name, g.pool, g.index))
                    kopf.event(body, type="Normal", reason=decision.reason, message=decision.message)
                    emitted.add((decision.reason, decision.message))
                    logger.info(decision.message)
                if decision.reason == "RollingOut":
                    may_roll = False
            for g in mine:
                if (g.pool, g.index) not in restarting and formed(g):
                    # The world formed: remember its ranks, so a rank recreated alone is noticed.
                    members = ",".join(sorted(p.uid for p in g.pods))
                    kube.merge_patch(
                        _group_path(namespace, name, g, backend),
                        {"metadata": {"annotations": {L.GROUP_MEMBERS: members}}},
                        LIFECYCLE_MANAGER,
                    )

        router = next((c for c in children if c["kind"] == "Deployment"), None)
        desired_status = compute_status(
            spec,
            name,
            namespace,
            generation,
            current_status,
            plan,
            groups,
            restarting,
            router["status"] if router else None,
            now,
            backend,
        )
        export_status(namespace, name, desired_status)
        if status_changed(current_status, desired_status):
            old_ready: dict[str, Any] = next(
                (c for c in current_status.get("conditions") or [] if c["type"] == "Ready"), {}
            )
            new_ready = next(c for c in desired_status["conditions"] if c["type"] == "Ready")
            transition = (new_ready["reason"], new_ready["message"])
            if (
                old_ready.get("reason"),
                old_ready.get("message"),
            ) != transition and transition not in emitted:
                kopf.event(
                    body,
                    type="Warning" if new_ready["reason"] == "WaitingForCapacity" else "Normal",
                    reason=new_ready["reason"],
                    message=new_ready["message"],
                )
            patch.status.update(desired_status)


def _stop(
    body: kopf.Body,
    patch: kopf.Patch,
    current_status: dict[str, Any],
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> None:
    """Report why nothing can be reconciled (Ready False, Degraded True) and touch no child."""
    conditions = current_status.get("conditions") or []
    stopped: tuple[tuple[str, Literal["True", "False"]], ...] = (("Ready", "False"), ("Degraded", "True"))
    for type_, status in stopped:
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)
    stop_status = {"observedGeneration": generation, "conditions": conditions}
    export_status(str(body.metadata.namespace or ""), str(body.metadata.name), stop_status)
    if status_changed(current_status, stop_status):
        kopf.warn(body, reason=reason, message=message)
        patch.status.update(stop_status)


def _remember_applied(namespace: str, obj: dict[str, Any], now: datetime) -> None:
    child_key = (obj["kind"], obj["metadata"]["name"])
    _recently_applied[(namespace, *child_key)] = (
        obj["metadata"]["annotations"][L.SPEC_HASH],
        _applied_epoch(now),
    )


def _template_change_of_running(
    obj: dict[str, Any], observed: dict[tuple[str, str], dict[str, Any]], pods: list[dict[str, Any]]
) -> bool:
    """A LeaderWorkerSet whose pod template changes while its group has pods."""
    have = observed.get((obj["kind"], obj["metadata"]["name"]))
    if obj["kind"] != "LeaderWorkerSet" or have is None:
        return False
    if have["annotations"].get(L.TEMPLATE_HASH) == obj["metadata"]["annotations"][L.TEMPLATE_HASH]:
        return False
    labels = obj["metadata"]["labels"]
    return any(p["pool"] == labels[L.POOL] and str(p["instance"]) == labels[L.INSTANCE] for p in pods)


def _group_path(namespace: str, name: str, g: GroupState, backend: GroupBackend) -> str:
    instance = L.instance_name(name, g.pool, g.index)
    if backend == "LeaderWorkerSet":
        return f"/apis/{LWS_API_VERSION}/namespaces/{namespace}/leaderworkersets/{instance}"
    return f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{instance}"


def _api_version(kind: str) -> str:
    return {
        "StatefulSet": "apps/v1",
        "Deployment": "apps/v1",
        "LeaderWorkerSet": LWS_API_VERSION,
        "PodDisruptionBudget": "policy/v1",
        "Role": "rbac.authorization.k8s.io/v1",
        "RoleBinding": "rbac.authorization.k8s.io/v1",
    }.get(kind, "v1")


def _indexes(kwargs: dict[str, Any]) -> dict[str, Any]:
    from moe_operator.handlers.indexes import CHILD_INDEXES

    names = ("node_index", "gpu_use_index", "engine_pod_index", "leaderworkerset_api_index", *CHILD_INDEXES)
    return {n: kwargs[n] for n in names}


@kopf.on.resume(GROUP, RESOURCE)
@kopf.on.create(GROUP, RESOURCE)
@kopf.on.update(GROUP, RESOURCE)
def on_change(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **kwargs: Any) -> None:
    key = (str(body.metadata.namespace or ""), str(body.metadata.name))
    wakeups.reconciled(key, time.monotonic())
    reconcile(body, patch, logger, _indexes(kwargs))
    wakeups.settled(key)


@kopf.timer(GROUP, RESOURCE, interval=WAKE_INTERVAL_S, initial_delay=WAKE_INTERVAL_S)
async def on_timer(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **kwargs: Any) -> None:
    """Level-based catch-up: a child changed (pod ready, pod failed) or the period passed (capacity appeared).

    Async so that a tick with nothing due costs no trip through the thread pool.
    """
    if wakeups.due((str(body.metadata.namespace or ""), str(body.metadata.name)), time.monotonic()):
        await rt.in_thread(reconcile, body, patch, logger, _indexes(kwargs))


@kopf.on.event("pods", labels=MANAGED)
@kopf.on.event("statefulsets", labels=MANAGED)
@kopf.on.event("deployments", labels=MANAGED)
async def on_child_event(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    """A pod or workload of a deployment changed: reconcile it on the next tick, not the next period."""
    deployment = labels.get(L.DEPLOYMENT)
    if deployment and namespace:
        wakeups.mark((namespace, deployment))


@kopf.on.event(GROUP, RESOURCE)
async def on_event(event: kopf.RawEvent, **_: Any) -> None:
    """Track specs waiting for their first reconcile; a deleted deployment's planned nodes are free again."""
    obj = event["object"]
    meta = obj["metadata"]
    key = (str(meta.get("namespace") or ""), str(meta.get("name")))
    if event.get("type") == "DELETED":
        _claims.pop(str(meta.get("uid")), None)
        _tokens_present.discard(str(meta.get("uid")))
        wakeups.forget(key)
    elif meta.get("generation") == (obj.get("status") or {}).get("observedGeneration"):
        # Also here, not only after on_change: kopf writes the metadata before the status, and
        # the metadata event (old status) marks the spec pending again.
        wakeups.settled(key)
    elif not meta.get("deletionTimestamp"):
        wakeups.pending(key, time.monotonic())
