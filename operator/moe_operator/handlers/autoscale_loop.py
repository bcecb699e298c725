"""The autoscaler's shell: read SGLang's metrics, decide, act through status (docs/autoscaling.md).

Every TICK_S, for each MoEDeployment with a pool in autoscaling.mode Operator:
read each serving leader's /metrics -> the pools' intervals -> decide (autoscale.decide) ->
trim to the GPU budget -> advance the drain/boot protocol (autoscale.scale) -> write
status.autoscaling, post an event for what changed. The reconciler renders the sizes status
holds (autoscale.effective), so this loop never writes a child itself.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.api.conditions import Reason
from moe_operator.api.derived import Pool, pools, world_size
from moe_operator.api.names import GROUP, PLURAL
from moe_operator.api.types import parse_duration
from moe_operator.autoscale import codec, signals
from moe_operator.autoscale.decide import PoolDecision, PoolPolicy, decide_pool, within_budget
from moe_operator.autoscale.effective import applied_widths, existing_instances, pool_scales, with_widths
from moe_operator.autoscale.observe import idle, pool_observation
from moe_operator.autoscale.policy import pool_policy, scaled_pools
from moe_operator.autoscale.prior import resume
from moe_operator.autoscale.scale import (
    FAILED,
    WIDTH_RETRY_MAX_BOOTS,
    Scale,
    Step,
    advance,
    retry_pause_boots,
    width_failed,
    width_to_apply,
)
from moe_operator.control.client import RuntimeAnswerError, RuntimeClient
from moe_operator.handlers.state import DeploymentState, OperatorState, operator_of
from moe_operator.handlers.widths import running_spec
from moe_operator.reconcile.observe import previous_sites, trusted_pods
from moe_operator.render.shared import router_listing
from moe_operator.validation import validate

TICK_S = float(os.environ.get("MOE_AUTOSCALE_INTERVAL_S", "30"))
SCRAPE_TIMEOUT_S = 2.0  # per read (a slow peer is cut at 4x this): a tick of 256 leaders stays bounded
SCRAPE_WORKERS = 16
Samples = dict[str, dict[int, signals.InstanceSample]]


Widths = dict[tuple[str, int], int]  # (pool, instance) -> nodes its group object runs on


def _groups(body: kopf.Body, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    key = (str(body.metadata.namespace or ""), str(body.metadata.name))
    return [*kwargs["statefulset_index"].get(key, []), *kwargs["leaderworkerset_index"].get(key, [])]


def leaders(body: kopf.Body, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployment's trusted engine pods."""
    key = (str(body.metadata.namespace or ""), str(body.metadata.name))
    return trusted_pods(
        kwargs["engine_pod_index"].get(key, []), _groups(body, kwargs), str(body.metadata.name)
    )


def running_widths(body: kopf.Body, kwargs: dict[str, Any]) -> Widths:
    """The width each instance's group runs (the site recorded on its object, which a width change
    holds back until the instance's turn); an instance whose annotation is not the operator's has none."""
    sites = previous_sites(_groups(body, kwargs), str(body.metadata.name))
    return {(s.pool, s.index): len(s.nodes) for s in sites}


def _ranks(pods: list[dict[str, Any]], pool: Pool) -> dict[int, list[bool]]:
    """Instance -> its ranks' readiness (pods not being deleted; one pod per node)."""
    by: dict[int, list[bool]] = {}
    for p in pods:
        if p["pool"] == pool and not p["deleting"]:
            by.setdefault(int(p["instance"]), []).append(bool(p["ready"]))
    return by


def ready_instances(spec: MoEDeploymentSpec, pods: list[dict[str, Any]], pool: Pool) -> frozenset[int]:
    """Instances of ``pool`` whose every rank is ready."""
    want = pools(spec)[pool].nodes_per_replica
    return frozenset(i for i, r in _ranks(pods, pool).items() if len(r) == want and all(r))


def at_width(spec: MoEDeploymentSpec, pods: list[dict[str, Any]], pool: Pool) -> frozenset[int]:
    """Instances of ``pool`` with as many ranks as the spec's width (not one still at the old width)."""
    want = pools(spec)[pool].nodes_per_replica
    return frozenset(i for i, r in _ranks(pods, pool).items() if len(r) == want)


def width_view(
    spec: MoEDeploymentSpec, pods: list[dict[str, Any]], pool: Pool, widths: Widths
) -> tuple[frozenset[int], frozenset[int]]:
    """(old, up): instances whose group runs another width than the spec's, and instances with every
    rank of the width their group runs present and ready (a missing rank is not up, whatever its width)."""
    want = pools(spec)[pool].nodes_per_replica
    runs = {i: w for (p, i), w in widths.items() if p == pool}
    old = frozenset(i for i, w in runs.items() if w != want)
    up = frozenset(i for i, r in _ranks(pods, pool).items() if len(r) == runs.get(i, want) and all(r))
    return old, up


def surge_room(
    spec: MoEDeploymentSpec, policies: dict[Pool, PoolPolicy], scales: dict[Pool, Scale],
    decisions: dict[Pool, PoolDecision], widths: Widths, pool: Pool, committed: int,
) -> bool:  # fmt: skip
    """One more instance of ``pool`` at its new width fits maxReplicas and the GPU budget: each
    instance counted at the width its group runs, every pool's growth this tick, and ``committed``
    (GPUs of extra instances this tick already made); the fixed pools at their spec size."""
    if scales[pool].instances >= policies[pool].max_instances:
        return False
    if spec.gpu_budget is None:
        return True
    held = held_gpus(spec, policies, scales, decisions, widths)
    return held + committed + policies[pool].width.gpus <= spec.gpu_budget


def held_gpus(
    spec: MoEDeploymentSpec, policies: dict[Pool, PoolPolicy], scales: dict[Pool, Scale],
    decisions: dict[Pool, PoolDecision], widths: Widths, leave_out: Pool | None = None,
) -> int:  # fmt: skip
    """GPUs the deployment holds or grows to this tick: each instance at the width its group runs,
    every pool's growth, the fixed pools at their spec size (``leave_out``: a pool not counted)."""
    held = sum(p.replicas * world_size(p, spec.topology) for n, p in pools(spec).items() if n not in scales)
    for n, s in scales.items():
        if n == leave_out:
            continue
        width = policies[n].width
        per_node = width.gpus // max(1, width.nodes)
        held += sum(per_node * widths.get((n, i), width.nodes) for i in range(s.instances))
        held += max(0, decisions[n].instances - s.instances) * width.gpus
    return held


def scrape(
    op: OperatorState, memo: DeploymentState, pods: list[dict[str, Any]], port: int, namespace: str, name: str
) -> Samples:
    """Read every leader's /metrics; an interval per instance from its previous read."""
    heads = [p for p in pods if p["rank"] == 0 and p["ip"] and not p["deleting"]]
    now = time.time()

    with RuntimeClient(timeout_s=SCRAPE_TIMEOUT_S) as client:

        def one(pod: dict[str, Any]) -> tuple[dict[str, Any], signals.Scrape | None]:
            try:
                return pod, signals.parse(client.engine_metrics(str(pod["ip"]), port), now)
            except (RuntimeAnswerError, signals.ExpositionError):
                return pod, None

        with ThreadPoolExecutor(max_workers=SCRAPE_WORKERS) as workers:
            read = list(workers.map(one, heads))
    out: Samples = {}
    seen = set()
    for pod, new in read:
        key = (str(pod["pool"]), int(pod["instance"]), str(pod["uid"]))
        seen.add(key)
        if new is None:
            op.metrics.counter("moe_operator_autoscale_scrape_failures_total", namespace, name, key[0]).inc()
            continue
        old = memo.scrapes.get(key)
        memo.scrapes[key] = new
        try:
            sample = signals.between(old, new) if old is not None else None
        except signals.ExpositionError:  # numbers no engine has: left out, counted
            op.metrics.counter("moe_operator_autoscale_scrape_failures_total", namespace, name, key[0]).inc()
            continue
        if sample is not None:
            out.setdefault(key[0], {})[key[1]] = sample
    for gone in set(memo.scrapes) - seen:
        del memo.scrapes[gone]
    return out


def decide_all(
    spec: MoEDeploymentSpec, policies: dict[Pool, PoolPolicy], status: dict[str, Any], samples: Samples,
    scales: dict[Pool, Scale], now: float, pods: list[dict[str, Any]] | None = None,
) -> dict[Pool, tuple[PoolDecision, Any]]:  # fmt: skip
    """Each scaled pool's decision, trimmed to the budget; with the observation behind it."""
    out: dict[Pool, tuple[PoolDecision, Any]] = {}
    stored = status.get("autoscaling") or {}
    for pool, scale in scales.items():
        policy = policies[pool]
        ttft_from = decode_serving(samples, scales) if pool == "prefill" else None
        sized = None if pods is None else at_width(spec, pods, pool)
        ttft_sized = None if pods is None or ttft_from is None else at_width(spec, pods, "decode")
        obs = pool_observation(
            now, samples.get(pool, {}), scale.serving, policy.objectives, ttft_from, sized, ttft_sized,
            scale.rolling,
        )  # fmt: skip
        metrics = tuple(o.metric for o in policy.objectives)
        raw = stored.get(pool)
        text = str(raw.get("model") or "") if isinstance(raw, dict) else ""
        state = resume(codec.read_model(text, metrics, now), policy, obs, scale.instances)
        out[pool] = (decide_pool(policy, state, obs), obs)
    gpus: dict[str, int] = {p: policies[p].width.gpus for p in out}
    fixed = sum(p.replicas * world_size(p, spec.topology) for n, p in pools(spec).items() if n not in out)
    budget = (
        None if spec.gpu_budget is None else max(0, spec.gpu_budget - fixed)
    )  # what the fixed pools leave
    trimmed = within_budget({str(p): d for p, (d, _) in out.items()}, budget, gpus)
    return {p: (trimmed[p], obs) for p, (_, obs) in out.items()}


def decode_serving(samples: Samples, scales: dict[Pool, Scale]) -> dict[int, signals.InstanceSample]:
    """The decode instances on the router's list: where a P/D deployment's TTFT is observed."""
    d = scales.get("decode")
    return {
        i: s for i, s in samples.get("decode", {}).items() if d is None or (i < d.serving and i != d.rolling)
    }


ROUTER_POD_GONE_S = 30.0  # past its deletion time plus grace the kubelet has killed it (or its node is lost)


def router_of(indexes: dict[str, Any], key: tuple[str, str], now: float) -> dict[str, Any] | None:
    """The router Deployment's summary, with how many of its pods may still run a replaced list."""
    name = f"{key[1]}-router"
    router = next((d for d in indexes["deployment_index"].get(key, []) if d["name"] == name), None)
    if router is None:
        return None
    terminating = sum(1 for p in indexes["router_pod_index"].get(key, []) if still_terminating(p, now))
    return {**router, "terminatingPods": terminating}


def still_terminating(pod: dict[str, Any], now: float) -> bool:
    """Deleted, not finished, and not past its grace: a pod stuck terminating on a lost node (or a
    deletion an index missed during a re-list) holds no drain for longer than its own grace."""
    if not pod.get("deleteBy") or pod.get("phase") in ("Succeeded", "Failed"):
        return False
    deadline = codec.read_time(pod["deleteBy"])  # unreadable: held, at most until drainTimeout
    return deadline is None or now < deadline + ROUTER_POD_GONE_S


def router_settled(router: dict[str, Any] | None, pool: Pool, serving: int, off: int | None = None) -> bool:
    """The router Deployment lists ``serving`` instances of the pool (less ``off``), every pod runs
    that list, and no replaced pod still runs: one terminating finishes its requests, and may still
    be sent new ones until the Service drops it, on the workers of its old list. The Deployment's
    replicas, updated and ready counts leave terminating pods out, so the pods are counted."""
    if router is None or router.get("terminatingPods"):
        return False
    if int(router["status"].get("observedGeneration") or 0) < int(router.get("generation") or 0):
        return False  # the status is of the previous list's rollout
    listing = dict(
        part.split("=", 1)
        for part in str(router["annotations"].get(K.ROUTER_WORKERS, "")).split(",")
        if "=" in part
    )
    st = router["status"]
    # a count of 0 is left out of the status: a router scaled to 0 (with its generation observed
    # above, and no pod terminating) sends to no one, so its drains end on the instance's own
    counts = [st.get(k) or 0 for k in ("replicas", "updatedReplicas", "readyReplicas")]
    rolled = all(isinstance(c, int) for c in counts) and counts[0] == counts[1] == counts[2]
    expected = router_listing(serving, off)
    return listing.get(pool) == expected and rolled and not st.get("unavailableReplicas")


def act(
    spec: MoEDeploymentSpec, pool: Pool, policy: PoolPolicy, scale: Scale, decision: PoolDecision,
    pods: list[dict[str, Any]], samples: Samples, router: dict[str, Any] | None, now: float,
    view: tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int]], room: bool,
) -> Step:  # fmt: skip
    """``view``: width_view's (old, up) for the pool, its instances the reconciler says a width change
    cannot roll yet, and those it says run an older pod template."""
    ready = ready_instances(spec, pods, pool)
    need = None if decision.reason == "no_data" else decision.need  # no data cancels nothing
    settled = router_settled(router, pool, scale.serving, scale.rolling)
    quiet = idle(samples.get(pool, {}))
    old, up, blocked, outdated = view
    return advance(
        scale, decision.instances, need, ready, quiet, now, policy.boot_s, policy.drain_timeout_s, settled,
        old, room, up, blocked, outdated,
    )  # fmt: skip


WARNINGS = frozenset(
    {
        Reason.SCALE_OUT_ROLLED_BACK, Reason.DRAIN_TIMED_OUT, Reason.WIDTH_ROLL_STUCK, Reason.WIDTH_ROLL_WAITING,
        Reason.SPEC_ROLL_STUCK, Reason.SPEC_ROLL_WAITING,
    }
)  # fmt: skip


def report(
    op: OperatorState, body: kopf.Body, logger: kopf.Logger, pool: Pool, step: Step, decision: PoolDecision,
    written: dict[str, Any], widened_before: Any,
) -> None:  # fmt: skip
    """One pool's tick in metrics, events and the log."""
    namespace, name = str(body.metadata.namespace or ""), str(body.metadata.name)
    for reason in FAILED:  # at 0 from the first decision, so that an alert's increase() sees the first
        op.metrics.counter("moe_operator_autoscale_decisions_total", namespace, name, pool, reason)
    op.metrics.counter(
        "moe_operator_autoscale_decisions_total", namespace, name, pool, written["reason"]
    ).inc()
    for kind, value in (
        ("target", step.scale.instances), ("serving", step.scale.serving), ("need", min(decision.load, 1_000_000)),
    ):  # fmt: skip
        op.metrics.gauge("moe_operator_autoscale_instances", namespace, name, pool, kind).set(value)
    if step.event:
        kind = "Warning" if Reason(step.event) in WARNINGS else "Normal"
        kopf.event(body, type=kind, reason=Reason(step.event).value, message=f"{pool}: {step.message}")
        logger.info(f"{name}/{pool}: {step.message}")
    widen = written.get("recommendedNodesPerReplica")
    if widen and widen != widened_before:
        message = f"{pool}: {decision.message}"
        kopf.event(body, type="Normal", reason=Reason.WIDER_INSTANCE_RECOMMENDED.value, message=message)


def choose_width(
    body: kopf.Body, written: MoEDeploymentSpec, spec: MoEDeploymentSpec, status: dict[str, Any],
    op: OperatorState, pool: Pool, decision: PoolDecision, step: Step, old: frozenset[int], others: int,
    now: float,
) -> dict[str, Any]:  # fmt: skip
    """Status fields for the width the pool runs at (autoscaling.widthChanges Apply): a new choice,
    with an event, when admission takes the spec at it; none once the pool runs the written width,
    or once the chosen width did not come up (given up, and not chosen again for a while)."""
    auto, mine = pools(written)[pool].autoscaling, pools(written)[pool].nodes_per_replica
    running, scale = pools(spec)[pool].nodes_per_replica, step.scale
    boot = parse_duration(auto.boot_time) if auto is not None else 0.0
    raw = (status.get("autoscaling") or {}).get(pool)
    raw = raw if isinstance(raw, dict) else {}
    failures = codec.read_failures(raw)
    if running != mine and width_failed(step):
        return give_up_width(body, pool, mine, running, failures + 1, boot, now)
    retry_at = codec.read_retry(raw, now, WIDTH_RETRY_MAX_BOOTS * boot)
    # every instance runs the chosen width: the count of those that did not starts over
    ran = {"widthFailures": None} if running != mine and not old and scale.rolling is None else {}
    recommended = decision.width.nodes if decision.width is not None else None
    apply = auto is not None and auto.width_changes == "Apply"
    wide = decision.width.gpus * max(scale.instances, decision.instances) if decision.width else 0
    fits = spec.gpu_budget is None or others + wide <= spec.gpu_budget  # every instance at that width
    width, held = width_to_apply(apply, recommended, running, scale, old, fits, retry_at, now)
    if width is not None:
        # wider than what runs, so never the written width: the other pool's choice comes along
        chosen = {**applied_widths(written, status), pool: width}
        checks = lambda r: validate(r, None, op.platform, str(body.metadata.namespace or ""))  # noqa: E731
        if with_widths(dict(body.spec), chosen, checks) is not None:
            message = f"{pool}: running {width} node(s) per instance instead of {running}; {decision.message}"
            kopf.event(body, type="Normal", reason=Reason.WIDTH_CHOSEN.value, message=message)
            return {"nodesPerReplica": width, "nodesPerReplicaFrom": mine, "widthHeld": None, **ran}
        held = f"the spec at {width} node(s) per instance fails admission's checks"
    fields: dict[str, Any] = {"widthHeld": held or None, "widthRetryAfter": codec.write_time(retry_at)}
    if running == mine:  # no choice runs (none, or one the spec's edit ended): none stays in status
        fields.update(nodesPerReplica=None, nodesPerReplicaFrom=None)
    return {**fields, **ran}


def give_up_width(
    body: kopf.Body, pool: Pool, mine: int, running: int, failures: int, boot_s: float, now: float
) -> dict[str, Any]:
    """The chosen width did not come up (the ``failures``-th in a row): the pool goes back to the
    spec's (each instance at the chosen width rolls back, as a width change), and no wider width is
    chosen for a pause that doubles with each one in a row."""
    boots = retry_pause_boots(failures)
    message = (
        f"{pool}: back to {mine} node(s) per instance: an instance at {running} did not come up "
        f"({failures} chosen width(s) in a row); no wider width is chosen for {boots * boot_s:.0f}s "
        f"(bootTime x{boots})"
    )
    kopf.event(body, type="Warning", reason=Reason.WIDTH_GIVEN_UP.value, message=message)
    return {
        "nodesPerReplica": None, "nodesPerReplicaFrom": None, "widthHeld": None,
        "widthRetryAfter": codec.write_time(now + boots * boot_s), "widthFailures": min(failures, 64),
    }  # fmt: skip


@kopf.timer(GROUP, PLURAL, interval=TICK_S, initial_delay=TICK_S)
def autoscale_timer(
    body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, memo: Any, **kwargs: Any
) -> None:
    """Scrape -> decide -> budget -> advance -> status and events, for the pools the operator scales."""
    try:
        written = MoEDeploymentSpec.model_validate(dict(body.spec))
    except ValueError:
        return  # the reconciler reports invalid specs
    status = dict(body.get("status") or {})
    op = operator_of(memo)
    namespace, name, now = str(body.metadata.namespace or ""), str(body.metadata.name), time.time()
    for gone in set(status.get("autoscaling") or {}) - set(scaled_pools(written)):  # no stale alerts
        op.metrics.forget_pool(namespace, name, str(gone), "moe_operator_autoscale_")
    if not scaled_pools(written):
        if status.get("autoscaling"):
            patch.status["autoscaling"] = None
        return
    spec = running_spec(written, dict(body.spec), status, op.platform, namespace)  # at the widths it chose
    pods = leaders(body, kwargs)
    samples = scrape(op, op.deployment(str(body.metadata.uid)), pods, spec.engine.port, namespace, name)
    scales = pool_scales(spec, status, now, existing_instances(pods))
    policies = {pool: pool_policy(spec, pool) for pool in scales}  # once per tick: the KV model per width
    key = (namespace, name)
    router = router_of(kwargs, key, now)
    updates: dict[str, Any] = {p: None for p in status.get("autoscaling") or {} if p not in scales}
    decided = decide_all(spec, policies, status, samples, scales, now, pods)
    decisions = {p: d for p, (d, _) in decided.items()}
    widths, committed = running_widths(body, kwargs), 0
    for pool, (decision, obs) in decided.items():
        room = surge_room(spec, policies, scales, decisions, widths, pool, committed)
        view = (
            *width_view(spec, pods, pool, widths), codec.read_indexes(status, pool, "widthBlocked"),
            codec.read_indexes(status, pool, "outdated"),
        )  # fmt: skip
        step = act(spec, pool, policies[pool], scales[pool], decision, pods, samples, router, now, view, room)
        extra = step.scale.instances - max(scales[pool].instances, decision.instances)
        committed += max(0, extra) * policies[pool].width.gpus  # a width change's extra instance
        updates[pool] = codec.write_pool(step.scale, step, decision, obs)
        before = ((status.get("autoscaling") or {}).get(pool) or {}).get("recommendedNodesPerReplica")
        report(op, body, logger, pool, step, decision, updates[pool], before)
        others = held_gpus(spec, policies, scales, decisions, widths, leave_out=pool) + committed
        fields = choose_width(body, written, spec, status, op, pool, decision, step, view[0], others, now)
        updates[pool].update(fields)
        if step.scale != scales[pool]:
            op.wakeups.mark(key)
    patch.status["autoscaling"] = updates
