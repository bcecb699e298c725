"""The runtime token's Secret on the sandbox: a pre-existing one is never adopted, a deleted one is
made again (issue 15, item 8)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml
from test_hostile_pods import REPO

from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, moed_path

pytestmark = pytest.mark.cluster


def _spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    obj["metadata"]["name"] = name
    obj["spec"]["eplb"].update({"refreshInterval": "10s", "minInterval": "10s", "history": "1m"})
    return obj


def _ready(api: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = api.get(moed_path(namespace, name)).json()
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def test_a_foreign_secret_under_the_token_name_stops_the_deployment(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess
) -> None:
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "planted-runtime-token"},
        "stringData": {"token": "chosen-by-someone-else"},
    }
    assert api.post(f"/api/v1/namespaces/{namespace}/secrets", json=planted).status_code == 201
    assert api.post(moed_path(namespace), json=_spec("planted")).status_code == 201
    cond = wait_for(
        lambda: (
            _ready(api, namespace, "planted").get("reason") == "TokenSecretNotOwned"
            and _ready(api, namespace, "planted")
        ),
        60,
        what="TokenSecretNotOwned",
    )
    assert "planted-runtime-token" in cond["message"] and "delete it" in cond["message"]
    sts = api.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets").json()["items"]
    assert sts == [], "children were created next to an untrusted token"
    secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/planted-runtime-token").json()
    assert "ownerReferences" not in secret["metadata"], "the planted Secret was adopted"
    # Deleting it lets the operator make its own, and the deployment proceeds.
    api.delete(f"/api/v1/namespaces/{namespace}/secrets/planted-runtime-token")
    wait_for(
        lambda: _ready(api, namespace, "planted").get("reason") != "TokenSecretNotOwned", 60, what="recovery"
    )
    made = api.get(f"/api/v1/namespaces/{namespace}/secrets/planted-runtime-token").json()
    assert made["metadata"]["ownerReferences"][0]["kind"] == "MoEDeployment"


def test_a_deleted_token_secret_is_made_again(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess
) -> None:
    assert api.post(moed_path(namespace), json=_spec("regrow")).status_code == 201
    path = f"/api/v1/namespaces/{namespace}/secrets/regrow-runtime-token"
    first = wait_for(
        lambda: api.get(path).status_code == 200 and api.get(path).json(), 60, what="token Secret"
    )
    assert api.delete(path).status_code == 200

    def remade() -> dict[str, Any] | None:
        resp = api.get(path)
        obj: dict[str, Any] = resp.json()
        return obj if resp.status_code == 200 and obj["metadata"]["uid"] != first["metadata"]["uid"] else None

    wait_for(remade, 60, interval=1, what="the token Secret made again")
