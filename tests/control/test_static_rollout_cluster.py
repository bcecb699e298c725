"""eplb mode static on the sandbox: a published placement version rolls instances one at a time.

The control loop's part (publishing a version and recording it in status.placement) is
covered by test_control_loop_e2e.py; here the version is written to status the way the loop
writes it, and the real reconciler must roll the pods onto it without taking the pool down.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_operator.api.keys import BOOT_PLACEMENT
from moe_sandbox.testing import wait_for
from operator_harness import moed_path

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NAME = "static-eplb"


def ready(obj: dict[str, Any]) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def pods(api: httpx.Client, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(
        f"/api/v1/namespaces/{namespace}/pods",
        params={"labelSelector": f"moe.inference.dev/deployment={NAME},moe.inference.dev/instance"},
    ).json()["items"]
    return items


def pod_ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])


def test_static_placement_version_rolls_instances_one_at_a_time(api: httpx.Client, deployed: str) -> None:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
    obj["metadata"]["name"] = NAME
    obj["spec"].pop("prefill")
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 2, "attentionDataParallel": 8})
    obj["spec"]["eplb"].update({"mode": "static", "redundantExperts": 8})
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    wait_for(lambda: ready(api.get(moed_path(deployed, NAME)).json()), 120, interval=0.5, what="Ready")
    before = {p["metadata"]["uid"] for p in pods(api, deployed)}
    assert len(before) == 4 and not any(
        BOOT_PLACEMENT in p["metadata"].get("annotations", {}) for p in pods(api, deployed)
    )

    # What the control loop records when it publishes v1 of the decode placement.
    resp = api.patch(
        f"{moed_path(deployed, NAME)}/status",
        json={"status": {"placement": {"decode": {"version": 1, "message": "new placement (test)"}}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text

    serving_min, deadline = 2, time.monotonic() + 120
    while time.monotonic() < deadline:
        current = pods(api, deployed)
        by_instance: dict[str, list[dict[str, Any]]] = {}
        for p in current:
            by_instance.setdefault(p["metadata"]["labels"]["moe.inference.dev/instance"], []).append(p)
        serving = sum(
            1 for group in by_instance.values() if len(group) == 2 and all(pod_ready(p) for p in group)
        )
        serving_min = min(serving_min, serving)
        booted = [p["metadata"].get("annotations", {}).get(BOOT_PLACEMENT) for p in current]
        rolled = (
            len(current) == 4 and booted == ["1"] * 4 and not {p["metadata"]["uid"] for p in current} & before
        )
        if rolled and ready(api.get(moed_path(deployed, NAME)).json()):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the pods did not roll onto placement v1 in 120s: {booted}")
    assert serving_min >= 1, "both instances restarted at once"
