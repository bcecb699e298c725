"""Group semantics as actions: which instances restart whole, roll, or have their world recorded (pure).

The lifecycle (moe_operator.lifecycle) decides per group; this turns its decisions for every
pool into a list of actions for the shell, keeping spec rolls one instance per pool at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from moe_operator.api.conditions import Reason
from moe_operator.lifecycle import (
    GroupDecision,
    GroupState,
    changes_template,
    changes_width,
    decide,
    formed,
    is_ready,
    pool_may_roll,
    restarts_after,
    rolls_to_new_width,
)
from moe_operator.topology.planner import InstanceSite, Waiting


@dataclass(frozen=True)
class Restart:
    """Restart all ranks of one instance: record the new epoch and count, then recreate its pods."""

    group: GroupState
    reason: Reason
    message: str
    restarts: int  # the count to record
    orphans: tuple[str, ...]  # pods on Nodes that no longer exist: force-delete them


@dataclass(frozen=True)
class GroupActions:
    restarts: list[Restart] = field(default_factory=list)
    # instances whose world formed: record these pod UIDs so a rank recreated alone is noticed
    members: list[tuple[GroupState, str]] = field(default_factory=list)
    # (pool, index) -> (reason, message) of every instance restarting, rolling or backing off
    restarting: dict[tuple[str, int], tuple[Reason, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class WidthGate:
    """An autoscaled pool's rolls (autoscale.scale), to a new width or to a new pod template: of its
    first ``held`` instances (those listed, and one a scale-in drains), one that formed its world rolls
    only when it is ``released`` (drained off the router); None: none may yet. One that never formed
    and is not ready (pending) serves nothing and rolls as in any pool."""

    held: int
    released: int | None = None

    def holds(self, group: GroupState) -> bool:
        """A group of the first ``held`` that formed its world or is ready (it may serve), not the released
        one. (A world on a template that changed while its pods were pending is never recorded.)"""
        serves = bool(group.members) or is_ready(group)
        return group.index < self.held and serves and group.index != self.released


def group_actions(
    groups: Sequence[GroupState],
    now: datetime,
    nodes: Collection[str],
    gates: Mapping[str, WidthGate] | None = None,
) -> GroupActions:
    """``nodes``: the Nodes that exist. Rolls go one instance per pool at a time; in a pool with a
    ``gates`` entry a listed instance rolls to a new width only once the autoscaler released it."""
    out = GroupActions()
    groups = width_changes(groups, nodes)
    for pool in sorted({g.pool for g in groups}):
        mine = sorted((g for g in groups if g.pool == pool), key=lambda g: g.index)
        gate = (gates or {}).get(pool)
        # an autoscaled pool's instances that served at their old width (or on their old template)
        # change it only once drained and released, even one whose new nodes another instance runs
        # (or in another's way)
        held = {
            g.index
            for g in mine
            if gate is not None and gate.holds(g) and (changes_width(g, now) or changes_template(g, now))
        }
        # groups that restart whatever the roll does (broken, or width changes that cannot wait) are
        # this pass's instances down: the roll goes on once they are ready again
        rolled = any(decide(g, now, False).action == "restart" for g in mine if g.index not in held)
        for g in mine:
            if g.index in held:
                continue
            # an instance that is not ready serves nothing: rolling it costs no capacity
            may = pool_may_roll(mine, g)
            released = gate is not None and g.index == gate.released and (bool(g.members) or is_ready(g))
            if released and (rolls_to_new_width(g, now) or changes_template(g, now)):
                may = True  # drained first: the autoscaler saw the others up
            decision = decide(g, now, not rolled and may)
            if released and changes_width(g, now) and not rolls_to_new_width(g, now):
                # drained first, so a roll, not a failure: its new nodes free up as the others roll
                decision = GroupDecision(
                    "restart", Reason.ROLLING_OUT,
                    f"{pool} instance {g.index}: rolling from {g.nnodes} to {g.resized_to} nodes, drained "
                    "first; it starts once another instance leaves its new nodes",
                )  # fmt: skip
            if decision.action == "none":
                continue
            reason = Reason(decision.reason)
            out.restarting[(g.pool, g.index)] = (reason, decision.message)
            if decision.action == "restart":
                count = g.restarts if reason == Reason.ROLLING_OUT else restarts_after(g, now)
                orphans = tuple(p.name for p in g.pods if p.node and p.node not in nodes)
                out.restarts.append(Restart(g, reason, decision.message, count, orphans))
            if reason == Reason.ROLLING_OUT:
                rolled = True
        for g in mine:
            if (g.pool, g.index) not in out.restarting and formed(g):
                out.members.append((g, ",".join(sorted(p.uid for p in g.pods))))
    return out


def width_changes(groups: Sequence[GroupState], nodes: Collection[str]) -> list[GroupState]:
    """A resized group with a pod on a Node that is gone restarts at once as a moved group. (A width
    change that cannot wait its turn restarts at once by itself: a group whose new nodes another
    instance still runs, and one whose nodes another instance is planned onto; lifecycle.
    rolls_to_new_width. Every other resized group of any pool rolls on, one at a time.)"""
    out = []
    for g in groups:
        if g.moved and g.resized_to and any(p.node and p.node not in nodes for p in g.pods):
            g = replace(g, resized_to=0)
        out.append(g)
    return out


def kept_while_waiting(
    waiting: Sequence[Waiting],
    gates: Mapping[str, WidthGate],
    previous: Sequence[InstanceSite],
    widths: Mapping[str, int],
    pods: Sequence[Mapping[str, Any]],
    nodes: Collection[str],
) -> frozenset[tuple[str, int]]:
    """Instances of an autoscaled pool the plan cannot place at their new width (a full cluster) that
    still run whole at the old one (every rank running and ready, none restarted, on nodes that
    exist), listed or draining and not released: their group stays until the autoscaler drains and
    releases them. Deleting it would drop what they serve; one that breaks goes as before."""
    out = set()
    for w in waiting:
        gate, site = gates.get(w.pool), next((p for p in previous if p.key == w.key), None)
        if gate is None or site is None or not w.index < gate.held or w.index == gate.released:
            continue
        ranks = [p for p in pods if (p["pool"], p["instance"]) == w.key and not p.get("deleting")]
        whole = len(ranks) == len(site.nodes) and all(
            p["phase"] == "Running" and p["ready"] and not p["restarts"] and p["node"] in nodes for p in ranks
        )
        if len(site.nodes) != widths.get(w.pool) and whole:
            out.add(w.key)
    return frozenset(out)
