"""Chaos: the operator is killed with SIGKILL in the middle of a rolling spec change."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import pytest
from e2e_moe import (
    Recovery,
    Sampler,
    by_instance,
    children,
    engine_pods,
    events,
    get_moed,
    instance_of,
    is_ready,
    merge_patch,
    moed_path,
    pod_serving,
    qwen3,
    wait_ready,
)
from e2e_target import Target

from moe_sandbox.testing import wait_for

pytestmark = pytest.mark.cluster

REPLICAS = 3
ROLL_ENV = {"name": "E2E_ROLLOUT", "value": "1"}


def _rolled(pod: dict[str, Any]) -> bool:
    return ROLL_ENV in (pod["spec"]["containers"][0].get("env") or [])


@pytest.mark.sandbox_only("kills the operator process with SIGKILL")
def test_operator_kill9_during_rollout_converges_one_instance_at_a_time(
    api: httpx.Client, deployed: str, target: Target, recovery: Recovery
) -> None:
    _, operator = target.require_sandbox()
    obj = qwen3(REPLICAS)
    name = obj["metadata"]["name"]
    assert api.post(moed_path(deployed), json=obj).status_code == 201
    wait_ready(api, deployed, name)
    before = children(api, deployed, name)
    first = {p["metadata"]["uid"] for p in engine_pods(api, deployed, name)}

    def observe() -> list[tuple[int, str, bool]]:
        """(instance, pod uid, serving) of every engine pod right now."""
        return [
            (instance_of(p)[1], p["metadata"]["uid"], pod_serving(p))
            for p in engine_pods(api, deployed, name)
        ]

    with Sampler(observe, interval=0.2) as seen:
        # A pod-template change: instances roll one at a time, each only when all are ready.
        merge_patch(api, moed_path(deployed, name), {"spec": {"engine": {"env": [ROLL_ENV]}}})
        start = time.monotonic()

        def rolling() -> bool:
            return any(
                p["metadata"]["uid"] not in first or p["metadata"].get("deletionTimestamp")
                for p in engine_pods(api, deployed, name)
            )

        wait_for(rolling, 60, interval=0.1, what="the first instance rolling")
        operator.stop(signal.SIGKILL)
        killed = time.monotonic()
        operator.start()
        recovery.record("operator back (kill -9 -> liveness + webhook)", time.monotonic() - killed)

        def converged() -> bool:
            pods = engine_pods(api, deployed, name)
            return (
                len(pods) == REPLICAS
                and all(_rolled(p) and pod_serving(p) for p in pods)
                and is_ready(get_moed(api, deployed, name))
            )

        wait_for(converged, 180, interval=0.5, what="every instance on the new spec and Ready")
        recovery.record("rollout converged after the kill", time.monotonic() - killed)
        recovery.record("whole rollout, spec change -> Ready", time.monotonic() - start)

    # Never more than one instance down at a time, the kill notwithstanding.
    down = [REPLICAS - len({i for i, _, serving in pods if serving}) for _, pods in seen.samples]
    assert down and max(down) <= 1, [d for d in down if d]
    # Every instance was restarted exactly once: one old and one new pod uid, nothing in between.
    uids = {i: {uid for _, pods in seen.samples for j, uid, _ in pods if j == i} for i in range(REPLICAS)}
    assert all(len(u) == 2 for u in uids.values()), uids
    # No duplicates and no re-creations: the same children (kind, name, uid) as before the roll.
    assert children(api, deployed, name) == before
    groups = by_instance(engine_pods(api, deployed, name))
    assert sorted(groups) == [("decode", i) for i in range(REPLICAS)]
    assert all(len(pods) == 1 for pods in groups.values())
    assert not first & {p["metadata"]["uid"] for p in engine_pods(api, deployed, name)}
    # Rolling is not breaking: no group restart was needed (the kill lost no state that mattered).
    assert not events(api, deployed, "GroupRestarting")
