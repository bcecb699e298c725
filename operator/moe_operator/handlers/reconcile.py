"""The MoEDeployment reconciler: a thin kopf shell, a short list of named steps.

Level-based: the same steps run on create/update/resume and on a short timer, read only kopf
indexes, write only what differs (by content hash), and never write status that did not
change. Every decision is a pure function (moe_operator.reconcile); the steps read, call them
and write. A spec the rules refuse (the webhook fails open) stops the reconcile before any
child is touched.

    check the spec -> choose the group backend -> ensure the runtime token -> plan the topology
    -> render -> diff -> apply and prune -> act on groups (restart, roll, record) -> write status
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from moe_contract.auth import KEY_BYTES
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.api.conditions import Reason
from moe_operator.api.names import GROUP, PLURAL
from moe_operator.autoscale.effective import existing_instances, pool_scales, sized_spec
from moe_operator.autoscale.scale import Scale
from moe_operator.handlers.indexes import CHILD_INDEXES, MANAGED, served_kinds
from moe_operator.handlers.kube import KubeError
from moe_operator.handlers.start_probe import read_starts
from moe_operator.handlers.state import DeploymentState, OperatorState, operator_of
from moe_operator.handlers.status_metrics import export_status
from moe_operator.handlers.widths import running_spec
from moe_operator.hardware import lookup_profile
from moe_operator.lifecycle import GroupState
from moe_operator.reconcile.backend import (
    backend_unavailable,
    leaderworkerset_state,
    recorded_group_backend,
    resolve_group_backend,
)
from moe_operator.reconcile.children import (
    ChildChanges,
    api_version,
    child_key,
    diff_children,
    keep_instances,
)
from moe_operator.reconcile.groups import GroupActions, WidthGate, group_actions, kept_while_waiting
from moe_operator.reconcile.observe import group_states, node_snapshot, previous_sites, trusted_pods
from moe_operator.reconcile.status import Event, compute_status, ready_event, status_changed, stop_status
from moe_operator.reconcile.token import key_of, owned_by
from moe_operator.render import labels as L
from moe_operator.render.children import placement_versions, render_children
from moe_operator.render.group import LWS_API_VERSION, GroupBackend, Owner, token_secret_name
from moe_operator.render.shared import token_secret
from moe_operator.topology.planner import TopologyPlan, plan_topology
from moe_operator.topology.requests import pool_requests, topology_policy
from moe_operator.validation import validate

RECONCILE_INTERVAL_S = 5.0  # every deployment is reconciled at least this often
WAKE_INTERVAL_S = 1.0  # deployments whose children changed are reconciled within about this
INDEXES = ("node_index", "gpu_use_index", "engine_pod_index", "optional_api_index", *CHILD_INDEXES)
Logger = logging.Logger | kopf.Logger


@dataclass(frozen=True)
class Target:
    """One reconcile of one MoEDeployment: what it is, what the indexes hold, and when."""

    body: kopf.Body
    patch: kopf.Patch
    logger: Logger
    indexes: dict[str, Any]
    op: OperatorState
    now: datetime

    @property
    def owner(self) -> Owner:
        meta = self.body.metadata
        return Owner(name=str(meta.name), namespace=str(meta.namespace or ""), uid=str(meta.uid))

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner.namespace, self.owner.name)

    @property
    def generation(self) -> int:
        return int(self.body.metadata.get("generation") or 0)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def state(self) -> DeploymentState:
        return self.op.deployment(self.owner.uid)

    def children(self) -> list[dict[str, Any]]:
        return [c for name in CHILD_INDEXES for c in self.indexes[name].get(self.key, [])]

    def pods(self) -> list[dict[str, Any]]:
        return list(self.indexes["engine_pod_index"].get(self.key, []))

    def event(self, event: Event) -> None:
        kopf.event(self.body, type=event.type, reason=event.reason, message=event.message)


def reconcile(t: Target) -> None:
    """Reconcile one MoEDeployment; a namespace being deleted ends it quietly (nothing to retry)."""
    if t.body.metadata.get("deletionTimestamp"):
        t.state.claims.clear()  # its nodes are free for others; garbage collection removes the children
        return
    try:
        with t.state.lock:
            _steps(t)
    except KubeError as exc:
        if exc.namespace_gone:
            t.logger.debug(f"namespace going away, skipping: {exc}")
            return
        raise


def _steps(t: Target) -> None:
    checked = check_spec(t)
    if checked is None:
        return
    # the widths the autoscaler runs its pools at (widthChanges Apply), when admission takes them
    checked = running_spec(checked, dict(t.body.spec), t.status, t.op.platform, t.owner.namespace)
    # the autoscaler's sizes where it scales; a lowered maxReplicas drains what exists
    scales = pool_scales(checked, t.status, t.now.timestamp(), existing_instances(t.pods()))
    spec, serving = sized_spec(checked, scales)
    # an autoscaled pool's width change: one instance off the router, rolled only once released
    off = {str(pool): s.rolling for pool, s in scales.items() if s.rolling is not None}
    gates = {str(pool): width_gate(s) for pool, s in scales.items()}
    backend = choose_backend(t, spec)
    if backend is None:
        return
    children = t.children()
    group_objects = [c for c in children if c["kind"] == backend]
    if not ensure_token(t):
        return
    plan = place_groups(t, spec, group_objects)
    monitoring = monitoring_kinds(t, spec)
    desired = render_children(
        spec, t.owner, plan, t.op.settings, placement_versions(t.status), backend, monitoring,
        compute_domain_usable(t, spec), serving, off,
    )  # fmt: skip
    observed = {(c["kind"], c["name"]): c for c in children}
    pods = trusted_pods(t.pods(), group_objects, t.owner.name)
    recent = t.state.recently_applied(time.time())  # by earlier reconciles: before this one applies
    changes = diff_children(desired, observed, recent, pods)
    kept = kept_groups(t, spec, plan, gates, group_objects, pods)
    apply_and_prune(t, keep_instances(changes, kept, t.owner.name))
    workloads = [o for o in desired if o["kind"] == backend]
    hashes = {o["metadata"]["name"]: o["metadata"]["annotations"][K.TEMPLATE_HASH] for o in workloads}
    settled = {
        o["metadata"]["name"]
        for o in workloads
        if recent.get(child_key(o)) == o["metadata"]["annotations"][K.SPEC_HASH]
    }
    groups = group_states(
        spec, t.owner.name, group_objects, pods, plan, hashes, read_starts(t, pods), settled, kept
    )
    actions = group_actions(groups, t.now, t.indexes["node_index"], gates)
    posted = act_on_groups(t, actions, changes, backend)
    router = next((c for c in children if c["kind"] == "Deployment"), None)
    desired_status = compute_status(
        spec, t.owner.name, t.owner.namespace, t.generation, t.status, plan, groups,
        actions.restarting, router["status"] if router else None, t.now, backend,
    )  # fmt: skip
    write_status(t, desired_status, posted)


def kept_groups(
    t: Target, spec: MoEDeploymentSpec, plan: TopologyPlan, gates: dict[str, WidthGate],
    group_objects: list[dict[str, Any]], pods: list[dict[str, Any]],
) -> frozenset[tuple[str, int]]:  # fmt: skip
    """Serving instances of autoscaled pools the plan cannot place at a new width: not pruned."""
    widths = {r.pool: r.nodes_per_instance for r in pool_requests(spec)}
    previous = previous_sites(group_objects, t.owner.name)
    return kept_while_waiting(plan.waiting, gates, previous, widths, pods, t.indexes["node_index"])


def width_gate(scale: Scale) -> WidthGate:
    """What an autoscaled pool's state holds back from a width roll: its listed instances and the one
    a scale-in drains, all but the width change's instance once it finished its requests."""
    held = scale.serving + (1 if scale.draining else 0)
    return WidthGate(held, scale.rolling if scale.released else None)


def check_spec(t: Target) -> MoEDeploymentSpec | None:
    """The parsed spec, or None after reporting why the rules refuse it."""
    problems = validate(dict(t.body.spec), None, t.op.platform, t.owner.namespace)
    if problems:
        stop(t, Reason.INVALID_SPEC, "; ".join(str(p) for p in problems)[:4000])
        return None
    return MoEDeploymentSpec.model_validate(dict(t.body.spec))


def choose_backend(t: Target, spec: MoEDeploymentSpec) -> GroupBackend | None:
    """StatefulSet or LeaderWorkerSet; None after reporting that the wanted one cannot run."""
    served = "LeaderWorkerSet" in served_kinds(t.indexes["optional_api_index"])
    lws = leaderworkerset_state(served, "LeaderWorkerSet" in t.op.watched_kinds)
    backend = resolve_group_backend(spec.topology.group_backend, recorded_group_backend(t.status), lws)
    if backend is None:
        stop(t, *backend_unavailable(spec.topology.group_backend, lws))
    return backend


def monitoring_kinds(t: Target, spec: MoEDeploymentSpec) -> frozenset[str]:
    """The spec.monitoring objects the cluster can take (Prometheus Operator CRDs served since the
    operator started); once per generation, an event names the ones skipped and why."""
    wanted = {
        k
        for k, on in (
            ("PodMonitor", spec.monitoring.pod_monitor),
            ("PrometheusRule", spec.monitoring.prometheus_rule),
        )
        if on
    }
    served = served_kinds(t.indexes["optional_api_index"])
    usable = frozenset(k for k in wanted if k in served and k in t.op.watched_kinds)
    skipped = sorted(set(wanted) - usable)
    if skipped and t.state.monitoring_noted != t.generation:
        t.state.monitoring_noted = t.generation
        t.event(Event("Normal", Reason.MONITORING_SKIPPED, monitoring_skipped(skipped, served)))
    return usable


def compute_domain_usable(t: Target, spec: MoEDeploymentSpec) -> bool:
    """Whether the pods get ComputeDomain claims: the hardware profile needs an IMEX channel and the
    cluster serves NVIDIA's ComputeDomain (watched since the operator started). Otherwise one event
    per generation says what is missing; the groups still run (NCCL and DeepEP fall back)."""
    hardware = spec.topology.hardware
    if not hardware or not lookup_profile(hardware).compute_domain:
        return False
    served = "ComputeDomain" in served_kinds(t.indexes["optional_api_index"])
    if served and "ComputeDomain" in t.op.watched_kinds:
        return True
    if t.state.compute_domain_noted != t.generation:
        t.state.compute_domain_noted = t.generation
        why = "was installed after the operator started; restart the operator" if served else "is not served"
        t.event(
            Event(
                "Warning",
                Reason.COMPUTE_DOMAIN_SKIPPED,
                f"spec.topology.hardware {hardware}: pods get no IMEX channel (multi-node NVLink): "
                f"resource.nvidia.com/v1beta1 ComputeDomain {why} (install NVIDIA's DRA driver)",
            )
        )
    return False


def monitoring_skipped(kinds: list[str], served: frozenset[str]) -> str:
    names = ", ".join(kinds)
    if all(k in served for k in kinds):
        return (
            f"spec.monitoring: {names} not created: the Prometheus Operator's CRDs were installed after the "
            "operator started; restart the operator to create them"
        )
    return (
        f"spec.monitoring: {names} not created: the cluster does not serve monitoring.coreos.com/v1 "
        "(install the Prometheus Operator's CRDs, or turn spec.monitoring.podMonitor/prometheusRule off)"
    )


def place_groups(t: Target, spec: MoEDeploymentSpec, group_objects: list[dict[str, Any]]) -> TopologyPlan:
    """Snapshot, plan and claim under one process-wide lock: two deployments planned at once would
    otherwise take the same free nodes, and the loser would move (and restart) on its next reconcile."""
    uid = t.owner.uid
    with t.op.plan_lock:
        nodes = node_snapshot(
            [v for vals in t.indexes["node_index"].values() for v in vals],
            {node: list(vals) for node, vals in t.indexes["gpu_use_index"].items()},
            uid,
            t.op.claims_of_others(uid),
        )
        previous = previous_sites(group_objects, t.owner.name)
        plan = plan_topology(pool_requests(spec), nodes, topology_policy(spec), previous)
        t.state.claims = {n: spec.topology.gpus_per_node for s in plan.sites for n in s.nodes}
    return plan


def ensure_token(t: Target) -> bool:
    """The runtime key Secret (instance tokens derive from it; pods mount only its digests): created
    once, kept across reconciles and operator restarts. Looked up once per deployment and process
    rather than watched: the operator needs no list/watch on Secrets (the control loop notices a
    deleted one and the next reconcile creates it again). One the deployment owns without a key (an
    older operator's shared token) is replaced; one it does not own is never adopted: False after
    reporting it."""
    if t.state.token_present:
        return True
    kube, owner = t.op.kube, t.owner
    name = token_secret_name(owner.name)
    path = f"/api/v1/namespaces/{owner.namespace}/secrets/{name}"
    # A deployment never reconciled has none yet: create it without looking first.
    existing = None if "observedGeneration" not in t.status else kube.get(path)
    if existing is None and kube.create(token_secret(owner, secrets.token_bytes(KEY_BYTES))) is None:
        existing = kube.get(path)  # it existed after all
    if existing is not None and key_of(existing, owner.uid) is None and owned_by(existing, owner.uid):
        kube.replace(path, token_secret(owner, secrets.token_bytes(KEY_BYTES)))
        t.logger.info(f"Secret {name}: replaced an older runtime token by a key and per-instance digests")
    elif existing is not None and key_of(existing, owner.uid) is None:
        stop(t, Reason.TOKEN_SECRET_NOT_OWNED, (
            f"Secret {name} exists but was not made by this MoEDeployment, so it cannot be trusted to "
            f"authorize placement pushes: delete it and the operator creates its own"
        ))  # fmt: skip
        return False
    t.state.token_present = True
    return True


def apply_and_prune(t: Target, changes: ChildChanges) -> None:
    """Apply what changed (held group objects wait for their roll), delete what is no longer planned."""
    now = time.time()
    for obj in t.op.kube.apply_in_waves(changes.apply):
        t.state.remember_applied(child_key(obj), obj["metadata"]["annotations"][K.SPEC_HASH], now)
        t.logger.info(f"applied {obj['kind']} {obj['metadata']['name']}")
    for kind, name in changes.prune:
        t.op.kube.delete(api_version(kind), kind, t.owner.namespace, name)
        t.logger.info(f"deleted {kind} {name}: no longer in the plan")


def act_on_groups(
    t: Target, actions: GroupActions, changes: ChildChanges, backend: GroupBackend
) -> set[tuple[str, str]]:
    """Restart or roll instances whole; record formed worlds. Returns the (reason, message) posted."""
    kube, ns, name = t.op.kube, t.owner.namespace, t.owner.name
    posted: set[tuple[str, str]] = set()
    for r in actions.restarts:
        annotations = {
            K.GROUP_EPOCH: t.now.isoformat(),
            K.GROUP_RESTARTS: str(r.restarts),
            K.GROUP_MEMBERS: "",
        }
        kube.merge_patch(
            group_path(t.owner, r.group, backend),
            {"metadata": {"annotations": annotations}},
            K.LIFECYCLE_MANAGER,
        )
        # Pods on a Node that no longer exists: no kubelet will ever confirm a graceful delete,
        # and their names block the StatefulSet until pod GC runs (~40 s+).
        for pod in r.orphans:
            kube.delete_pod(ns, pod, grace_period_s=0)
        instance = L.instance_name(name, r.group.pool, r.group.index)
        held = changes.hold.get(instance)
        if held is not None:  # the LeaderWorkerSet controller recreates the group on the new template
            kube.apply(held)
            t.state.remember_applied(
                child_key(held), held["metadata"]["annotations"][K.SPEC_HASH], time.time()
            )
            t.logger.info(f"applied {held['kind']} {instance}")
        if held is None or held["kind"] == "StatefulSet":  # a StatefulSet at its new width, too
            kube.delete_pods(ns, L.instance_selector(name, r.group.pool, r.group.index))
        t.event(Event("Normal", r.reason, r.message))
        posted.add((r.reason, r.message))
        t.logger.info(r.message)
    for group, members in actions.members:
        patch = {"metadata": {"annotations": {K.GROUP_MEMBERS: members}}}
        kube.merge_patch(group_path(t.owner, group, backend), patch, K.LIFECYCLE_MANAGER)
    return posted


def write_status(t: Target, desired: dict[str, Any], posted: set[tuple[str, str]]) -> None:
    """Export the status as metrics; patch it (and post a Ready event) only when it changed."""
    export_status(t.op, t.owner, desired)
    if not status_changed(t.status, desired):
        return
    event = ready_event(t.status, desired, posted)
    if event is not None:
        t.event(event)
    t.patch.status.update(desired)


def stop(t: Target, reason: Reason, message: str) -> None:
    """Report why nothing can be reconciled (Ready False, Degraded True) and touch no child."""
    desired = stop_status(t.status, reason, message, t.generation, t.now)
    export_status(t.op, t.owner, desired)
    if status_changed(t.status, desired):
        kopf.warn(t.body, reason=reason, message=message)
        t.patch.status.update(desired)


def group_path(owner: Owner, group: GroupState, backend: GroupBackend) -> str:
    instance = L.instance_name(owner.name, group.pool, group.index)
    if backend == "LeaderWorkerSet":
        return f"/apis/{LWS_API_VERSION}/namespaces/{owner.namespace}/leaderworkersets/{instance}"
    return f"/apis/apps/v1/namespaces/{owner.namespace}/statefulsets/{instance}"


# --------------------------------------------------------------------------- kopf wiring


def _target(body: kopf.Body, patch: kopf.Patch, logger: Logger, memo: Any, kwargs: dict[str, Any]) -> Target:
    return Target(body, patch, logger, {n: kwargs[n] for n in INDEXES}, operator_of(memo), datetime.now(UTC))


@kopf.on.resume(GROUP, PLURAL)
@kopf.on.create(GROUP, PLURAL)
@kopf.on.update(GROUP, PLURAL)
def on_change(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: Any, **kwargs: Any) -> None:
    t = _target(body, patch, logger, memo, kwargs)
    t.op.wakeups.reconciled(t.key, time.monotonic())
    reconcile(t)
    t.op.wakeups.settled(t.key)


@kopf.timer(GROUP, PLURAL, interval=WAKE_INTERVAL_S, initial_delay=WAKE_INTERVAL_S)
async def on_timer(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: Any, **kwargs: Any) -> None:
    """Level-based catch-up: a child changed (pod ready, pod failed) or the period passed (capacity appeared).

    Async so that a tick with nothing due costs no trip through the thread pool.
    """
    op = operator_of(memo)
    if op.wakeups.due((str(body.metadata.namespace or ""), str(body.metadata.name)), time.monotonic()):
        await op.in_thread(reconcile, _target(body, patch, logger, memo, kwargs))


@kopf.on.event("pods", labels=MANAGED)
@kopf.on.event("statefulsets", labels=MANAGED)
@kopf.on.event("deployments", labels=MANAGED)
async def on_child_event(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    """A pod or workload of a deployment changed: reconcile it on the next tick, not the next period."""
    deployment = labels.get(K.DEPLOYMENT)
    if deployment and namespace:
        operator_of(memo).wakeups.mark((namespace, deployment))


@kopf.on.event(GROUP, PLURAL)
async def on_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Track specs waiting for their first reconcile; a deleted deployment's state (planned nodes,
    metric series, control-loop memory) is dropped."""
    op = operator_of(memo)
    meta = event["object"]["metadata"]
    key = (str(meta.get("namespace") or ""), str(meta.get("name")))
    if event.get("type") == "DELETED":
        op.forget(str(meta.get("uid")), *key)
    elif meta.get("generation") == (event["object"].get("status") or {}).get("observedGeneration"):
        # Also here, not only after on_change: kopf writes the metadata before the status, and
        # the metadata event (old status) marks the spec pending again.
        op.wakeups.settled(key)
    elif not meta.get("deletionTimestamp"):
        op.wakeups.pending(key, time.monotonic())
