"""Group semantics of one engine instance: when to restart all its ranks, when to roll it (pure).

Ranks of one NCCL/DeepEP world cannot rejoin singly: when any pod of an instance fails,
restarts, or was recreated on its own, every pod of the instance is restarted together,
with exponential backoff so a crash-looping group does not hammer the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from moe_operator.api.conditions import Reason

BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
STABLE_RESET_S = 600.0


@dataclass(frozen=True)
class PodState:
    name: str
    uid: str
    rank: int
    phase: str
    ready: bool
    restarts: int
    created: datetime
    template_hash: str
    node: str | None
    ready_changed: datetime | None = None  # lastTransitionTime of the pod's Ready condition


@dataclass(frozen=True)
class StartReport:
    """The start-up phase the instance's leader engine reported, and when it entered it."""

    phase: str
    entered: datetime


@dataclass(frozen=True)
class GroupState:
    """What the operator knows of one instance: its StatefulSet's annotations and its pods."""

    pool: str
    index: int
    nnodes: int
    template_hash: str
    epoch: datetime  # when the operator last (re)started the whole group
    restarts: int
    pods: tuple[PodState, ...]
    members: frozenset[str] = frozenset()  # pod UIDs of the running world, recorded once it formed
    moved: bool = False  # the planner gave the instance other nodes
    resized_to: int = 0  # nodes per instance the spec now asks for, when not ``nnodes`` (a width change)
    new_nodes_busy: bool = False  # its planned nodes still run other instances of the deployment
    in_the_way: bool = False  # another instance of the deployment is planned onto nodes it still runs
    unready_limit_s: float = float("inf")  # a running rank unready longer than this breaks the world
    start: StartReport | None = None  # the leader's start-up phase, while the group is not ready


def progressing(group: GroupState, now: datetime) -> bool:
    """The leader's engine entered its current start-up phase within the last half allowance: a slow
    start that moves, not a hung one. It earns up to twice the allowance."""
    s = group.start
    return (
        s is not None and s.phase != "ready" and (now - s.entered).total_seconds() < group.unready_limit_s / 2
    )


@dataclass(frozen=True)
class GroupDecision:
    action: Literal["none", "restart", "wait"]
    reason: str = ""
    message: str = ""
    retry_in: float = 0.0

    @property
    def restarting(self) -> bool:
        return self.action != "none"


def backoff_seconds(restarts: int) -> float:
    if restarts <= 0:
        return 0.0
    return float(min(BACKOFF_BASE_S * 2 ** (restarts - 1), BACKOFF_MAX_S))


def is_ready(group: GroupState) -> bool:
    """All ranks run and are ready (possibly on the previous template, while a roll waits)."""
    return len(group.pods) == group.nnodes and all(p.ready and p.phase == "Running" for p in group.pods)


def is_updated(group: GroupState) -> bool:
    return bool(group.pods) and all(p.template_hash == group.template_hash for p in group.pods)


def broken_reason(group: GroupState, now: datetime) -> str | None:
    """Why the group's world is broken, or None. A rank that runs but stays unready past the
    start-up budget (a hung worker: its engine stopped answering /health) breaks it too: the
    kubelet restarts only what fails liveness, and one rank cannot rejoin its world alone."""
    if group.moved and group.resized_to:
        change = f"its width changes ({group.nnodes} -> {group.resized_to} nodes)"
        if group.new_nodes_busy:
            return f"{change} onto nodes other instances still run, and every rank's world with it"
        if group.in_the_way:
            return f"{change}, and every rank's world with it; another instance is planned onto the nodes it runs on"
        return f"{change}, and every rank's world with it"
    if group.moved:
        return "the planner moved the instance to other nodes"
    for p in sorted(group.pods, key=lambda p: p.rank):
        if p.phase == "Failed":
            return f"pod {p.name} (rank {p.rank}) failed"
        if p.restarts > 0:
            return f"pod {p.name} (rank {p.rank}) restarted {p.restarts} time(s)"
        if group.members and p.uid not in group.members:
            return f"pod {p.name} (rank {p.rank}) was recreated alone"
        if p.phase == "Running" and not p.ready:
            since = max(p.ready_changed or p.created, group.epoch)
            limit = group.unready_limit_s * (2 if progressing(group, now) else 1)
            if (now - since).total_seconds() > limit:
                # no running count in the message: it must read the same on every reconcile
                where = f"; its leader's engine was in {group.start.phase}" if group.start else ""
                return (
                    f"pod {p.name} (rank {p.rank}) stayed unready longer than spec.engine.startupTimeout "
                    f"({group.unready_limit_s:.0f}s){where}"
                )
    return None


def decide(group: GroupState, now: datetime, may_roll: bool) -> GroupDecision:
    """Restart the whole group when it is broken (with backoff), or roll it to a new template.

    `may_roll` is False while another instance of the pool is not ready: spec changes roll
    instances one at a time so the pool keeps serving. A width change rolls too, while the
    instance's new nodes are free and no other instance is planned onto its nodes: until its turn
    the group runs on its old nodes (its group object is held back, reconcile.children).
    """
    if rolls_to_new_width(group, now):
        if not may_roll:
            return GroupDecision("none")
        return GroupDecision(
            "restart",
            Reason.ROLLING_OUT,
            f"{group.pool} instance {group.index}: rolling from {group.nnodes} to {group.resized_to} nodes "
            "(one instance at a time)",
        )
    reason = broken_reason(group, now)
    if reason is not None:
        wait = backoff_seconds(group.restarts) - (now - group.epoch).total_seconds()
        if wait > 0 and not group.moved:
            # An absolute time, not a countdown: the message (and so the status) stays the same
            # on every reconcile of the wait, instead of a status patch and an event per tick.
            at = (group.epoch + timedelta(seconds=backoff_seconds(group.restarts))).strftime("%H:%M:%SZ")
            return GroupDecision(
                "wait",
                Reason.RESTART_BACKOFF,
                f"{group.pool} instance {group.index}: {reason}; restarting the whole group at {at} "
                f"(restart {group.restarts + 1}, exponential backoff)",
                retry_in=wait,
            )
        return GroupDecision(
            "restart",
            Reason.GROUP_RESTARTING,
            f"{group.pool} instance {group.index}: {reason}; restarting all {group.nnodes} ranks together",
        )
    if not is_updated(group) and group.pods:
        if not may_roll:
            return GroupDecision("none")
        return GroupDecision(
            "restart",
            Reason.ROLLING_OUT,
            f"{group.pool} instance {group.index}: rolling to the new spec (one instance at a time)",
        )
    return GroupDecision("none")


def changes_width(group: GroupState, now: datetime) -> bool:
    """Moved only because its width changed, and otherwise whole (its nodes free or not)."""
    healthy = broken_reason(replace(group, moved=False), now) is None
    return group.moved and bool(group.resized_to) and healthy


def changes_template(group: GroupState, now: datetime) -> bool:
    """Whole at its width and nodes, with a pod on an older template: a spec roll restarts it."""
    return (
        bool(group.pods) and not group.moved and not is_updated(group) and broken_reason(group, now) is None
    )


def rolls_to_new_width(group: GroupState, now: datetime) -> bool:
    """Moved only because its width changed, onto free nodes, with no other instance waiting for its
    nodes, and otherwise whole: it may wait its turn."""
    free = not group.new_nodes_busy and not group.in_the_way
    return changes_width(group, now) and free


def formed(group: GroupState) -> bool:
    """Every rank runs the current template and no world is recorded yet: time to record its
    members. Old-template pods may still be running just after a roll was started; recording
    them would make their replacements look like ranks recreated alone."""
    running = [p for p in group.pods if p.phase == "Running" and p.template_hash == group.template_hash]
    return not group.members and len(running) == group.nnodes


def restarts_after(group: GroupState, now: datetime) -> int:
    """The restart count to record when restarting now: reset after a long stable run."""
    stable_for = (now - group.epoch).total_seconds()
    return 1 if stable_for > STABLE_RESET_S else group.restarts + 1


def pool_may_roll(groups: Sequence[GroupState], group: GroupState) -> bool:
    """May ``group`` roll now: when every other instance of the pool is ready, or when none is
    ready at all (nothing serving to protect). Its own readiness is not waited for (a pending
    group serves nothing), but one that is only briefly unready still waits for the others."""
    others = [g for g in groups if (g.pool, g.index) != (group.pool, group.index)]
    return all(is_ready(g) for g in others) or not any(is_ready(g) for g in groups)
