"""A hand-edited placement ConfigMap that breaks the map rules is refused with an event and balancing
goes on from the last good version, also across an operator restart (issue 15, item 6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_hostile_pods import REFRESH_S, _leaders, _spec

from moe_sandbox.testing import wait_for
from operator_harness import (
    OperatorProcess,
    auth_for,
    bind_model_volume,
    moed_path,
    pod_instance,
    replace_fresh,
    runtime_credentials,
    start_replay,
)

pytestmark = pytest.mark.cluster


def test_a_corrupted_live_placement_is_refused_and_balancing_continues(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    bind_model_volume(api, namespace, "models")
    obj = _spec("corrupt")
    obj["spec"].pop("prefill")
    obj["spec"]["decode"].update({"replicas": 1, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"].update({"redundantExperts": 16, "minImprovement": 0.0})
    assert api.post(moed_path(namespace), json=obj).status_code == 201
    (leader,) = _leaders(api, namespace, "corrupt", "decode", 1)
    token_file, key = runtime_credentials(api, namespace, "corrupt", tmp_path / "token")
    replay = start_replay(
        leader["status"]["podIP"], token_file, tmp_path / "replay.log", instance=pod_instance(leader),
        model="deepseek-v3", gpus=16, gpus_per_node=4, redundant=16,
    )  # fmt: skip
    live = f"/api/v1/namespaces/{namespace}/configmaps/corrupt-decode-placement"

    def shift(seed: int) -> None:
        """Move the hot experts, so that a new placement is worth publishing."""
        url = f"http://{leader['status']['podIP']}:9400/v1/replay/shift"
        r = httpx.post(url, json={"seed": seed}, headers=auth_for(key, leader), timeout=5)
        assert r.status_code == 200, r.text

    def version() -> int:
        status = api.get(moed_path(namespace, "corrupt")).json().get("status") or {}
        return int(((status.get("placement") or {}).get("decode") or {}).get("version") or 0)

    def corrupt() -> None:
        def layer3_keeps_expert0_only(cm: dict[str, Any]) -> None:
            doc = json.loads(cm["data"]["placement.json"])
            doc["version"] = 99
            doc["physicalToLogicalMap"][3] = [0] * len(doc["physicalToLogicalMap"][3])
            cm["data"]["placement.json"] = json.dumps(doc)

        assert replace_fresh(api, live, layer3_keeps_expert0_only).status_code == 200

    def refused() -> list[str]:
        items = api.get(f"/api/v1/namespaces/{namespace}/events").json()["items"]
        return [e["message"] for e in items if e.get("reason") == "PlacementRefused"]

    try:
        wait_for(lambda: version() >= 1, 8 * REFRESH_S, interval=1, what="a first placement")
        corrupt()
        messages = wait_for(refused, 4 * REFRESH_S, interval=1, what="PlacementRefused event")
        assert "has no slot" in messages[0], messages
        before = version()
        shift(7)
        wait_for(lambda: version() > before, 10 * REFRESH_S, interval=1, what="the next placement")
        assert version() < 99, "the corrupted version was adopted"
        # After a restart the operator reads the live ConfigMap first: broken again, it must fall
        # back to the newest valid kept copy and go on numbering from there.
        corrupt()
        moe_operator.restart()
        after = version()
        shift(8)
        wait_for(lambda: version() > after, 10 * REFRESH_S, interval=1, what="a placement after the restart")
        assert version() < 99
    finally:
        replay.terminate()
        replay.wait(10)
