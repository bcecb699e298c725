"""extraArgs admission on a real kube-apiserver: the operator's webhook refuses every invalid list
(create and dry-run), naming the field, the flag and the fix, and admits the valid ones."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from operator_harness import replace_fresh

from .extra_args_cases import ACCEPTED, REFUSED, ArgCase, spec_with

pytestmark = pytest.mark.cluster


def _obj(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "moe.inference.dev/v1alpha1",
        "kind": "MoEDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def _path(namespace: str) -> str:
    return f"/apis/moe.inference.dev/v1alpha1/namespaces/{namespace}/moedeployments"


def test_webhook_refuses_every_invalid_extra_args(
    moe_operator: Any, api: httpx.Client, namespace: str
) -> None:
    """One test for all cases (each a dry-run and a real create): the operator starts once."""
    failures: list[str] = []
    for case in REFUSED:
        for params in ({"dryRun": "All"}, {}):
            resp = api.post(_path(namespace), json=_obj(case.name, spec_with(case)), params=params)
            message = resp.json().get("message", "")
            if resp.status_code != 422 or "admission webhook" not in message:
                failures.append(f"{case.name} {params}: {resp.status_code} {message[:200]}")
                continue
            missing = [t for t in (case.field, *case.texts) if t not in message]
            if missing:
                failures.append(f"{case.name}: {missing} not in {message}")
    assert not failures, "\n".join(failures)
    assert api.get(_path(namespace)).json()["items"] == []


def test_webhook_admits_valid_extra_args(moe_operator: Any, api: httpx.Client, namespace: str) -> None:
    for case in ACCEPTED:
        resp = api.post(_path(namespace), json=_obj(case.name, spec_with(case)), params={"dryRun": "All"})
        assert resp.status_code == 201, f"{case.name}: {resp.text[:300]}"


def test_webhook_refuses_an_update_to_an_ambiguous_flag(
    moe_operator: Any, api: httpx.Client, namespace: str
) -> None:
    """Existing objects too: changing a valid list to the old --cuda-graph-max-bs is refused and changes nothing."""
    good = ArgCase("good", "decode", ("--cuda-graph-max-bs-decode", "128"))
    created = api.post(_path(namespace), json=_obj("flags", spec_with(good)))
    assert created.status_code == 201, created.text

    def ambiguous(current: dict[str, Any]) -> None:
        current["spec"]["decode"]["extraArgs"] = ["--cuda-graph-max-bs", "128"]

    resp = replace_fresh(api, f"{_path(namespace)}/flags", ambiguous)
    assert resp.status_code == 422, resp.text
    assert "spec.decode.extraArgs[0]" in resp.json()["message"]
    kept = api.get(f"{_path(namespace)}/flags").json()
    assert kept["spec"]["decode"]["extraArgs"] == ["--cuda-graph-max-bs-decode", "128"]
