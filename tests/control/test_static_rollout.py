"""eplb mode static: a new placement version reaches engines by rolling instances one at a time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import kopf

from moe_operator.api.keys import BOOT_PLACEMENT
from moe_operator.control.decide import Inputs, static_roll
from moe_operator.control.decide import decide as decide_publish
from moe_operator.handlers.indexes import engine_pod_index
from moe_operator.lifecycle import GroupState, PodState, decide, pool_may_roll
from moe_operator.render.children import placement_versions, render_children
from moe_operator.render.group import Owner, RuntimeSettings
from render_cases import TWO_CLIQUE_PLAN, gb200_decode_spec

OWNER = Owner("m", "ns", "uid-1")
PLAN = TWO_CLIQUE_PLAN
spec = gb200_decode_spec


def templates(mode: str, status: dict[str, Any]) -> list[dict[str, Any]]:
    objs = render_children(spec(mode), OWNER, PLAN, RuntimeSettings(), placement_versions(status))
    return [o["spec"]["template"]["metadata"]["annotations"] for o in objs if o["kind"] == "StatefulSet"]


def status(version: int) -> dict[str, Any]:
    return {"placement": {"decode": {"version": version, "message": "x"}}} if version else {}


def test_static_mode_pods_carry_the_boot_placement_and_a_new_version_changes_the_template() -> None:
    v3, v4, none = templates("static", status(3)), templates("static", status(4)), templates("static", {})
    assert [t[BOOT_PLACEMENT] for t in v3] == ["3", "3"]
    assert BOOT_PLACEMENT not in none[0]
    h = "moe.inference.dev/template-hash"
    assert v3[0][h] != v4[0][h] and v3[0][h] != none[0][h]  # a new version is a new template: it rolls


def test_online_modes_never_restart_pods_for_a_placement() -> None:
    for mode in ("operator", "engine"):
        v3, v4, none = templates(mode, status(3)), templates(mode, status(4)), templates(mode, {})
        assert v3 == v4 == none  # pushed online (or left to the engine): same template, no restart
        assert BOOT_PLACEMENT not in v3[0]


def test_a_new_static_placement_rolls_one_instance_at_a_time() -> None:
    """The reconciler's existing RollingOut logic does the rest: one instance, then the next."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    old = templates("static", status(3))[0]["moe.inference.dev/template-hash"]
    new = templates("static", status(4))[0]["moe.inference.dev/template-hash"]

    def group(index: int, pod_hash: str, ready: bool = True) -> GroupState:
        pods = tuple(
            PodState(
                f"m-decode-{index}-{r}",
                f"u{index}{r}",
                r,
                "Running",
                ready,
                0,
                now,
                pod_hash,
                f"n{index}-{r}",
            )
            for r in range(4)
        )
        return GroupState("decode", index, 4, new, now, 0, pods, frozenset(p.uid for p in pods))

    groups = [group(0, old), group(1, old)]
    first = decide(groups[0], now, pool_may_roll(groups, groups[0]))
    assert (first.action, first.reason) == ("restart", "RollingOut")
    # instance 0 restarting (not ready): instance 1 waits
    rolling = [group(0, new, ready=False), group(1, old)]
    assert decide(rolling[1], now, pool_may_roll(rolling, rolling[1])).action == "none"
    # instance 0 back on the new placement: instance 1 rolls
    done = [group(0, new), group(1, old)]
    assert decide(done[1], now, pool_may_roll(done, done[1])).reason == "RollingOut"


def test_placement_versions_reads_status() -> None:
    st = {"placement": {"decode": {"version": 7}, "prefill": {"message": "no windows"}}}
    assert placement_versions(st) == {"decode": 7}
    assert placement_versions({}) == {}


def _pod_summary(name: str, template: dict[str, Any]) -> dict[str, Any]:
    """What the operator's pod index keeps of a pod the StatefulSet made from ``template``."""
    meta = template["metadata"]
    raw: Any = {
        "metadata": {"name": name, "uid": name, "labels": meta["labels"], "annotations": meta["annotations"]}
    }
    index: Any = engine_pod_index  # kopf's decorator types it as a handler with every kwarg
    body = kopf.Body(raw)
    found = asyncio.run(index(name=name, namespace="ns", body=body, spec=body.spec, status=body.status))
    assert found is not None
    summary: dict[str, Any] = next(iter(found.values()))
    return summary


def test_a_static_pool_publishes_again_only_once_every_instance_runs_the_live_placement() -> None:
    """Each static publish is a roll of the whole pool, one drained instance at a time; one published
    before the last roll ended restarted it, and a pool rolling longer than minInterval never ended."""
    objs = render_children(spec("static"), OWNER, PLAN, RuntimeSettings(), placement_versions(status(4)))
    v4 = next(o["spec"]["template"] for o in objs if o["kind"] == "StatefulSet")
    v3 = templates("static", status(3))[0]
    on_v4 = _pod_summary("m-decode-0-0", v4)
    assert on_v4["bootPlacement"] == "4"
    assert static_roll(4, {"m-decode-0-0": "4", "m-decode-1-0": "4"}) == ""
    behind = static_roll(4, {"m-decode-0-0": on_v4["bootPlacement"], "m-decode-1-0": v3[BOOT_PLACEMENT]})
    assert behind.startswith("1 of 2 instance(s)") and "m-decode-1-0" in behind and "v4" in behind
    assert static_roll(0, {"m-decode-0-0": ""}) == ""  # nothing published: nothing to roll onto
    assert static_roll(1, {"a": ""}) != ""  # booted before any version (or in another mode)
    many = static_roll(9, {f"p{i}": "8" for i in range(5)})
    assert many.startswith("5 of 5") and "and 2 more" in many

    def reason(mode: str, rolling: str) -> str:
        return decide_publish(Inputs(mode, 0.4, 0.9, 5, 0.03, 20, 60.0, None, rolling=rolling)).reason  # type: ignore[arg-type]

    assert reason("static", behind) == "rolling"
    assert reason("static", "") == "published"
    assert reason("operator", behind) == "published"  # online modes restart nothing
