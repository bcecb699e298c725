"""The generated CRD in a real kube-apiserver: examples accepted, schema and CEL refusals name the field."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_operator.api import build_crd
from operator_harness import install_crd, replace_fresh

from .invalid_specs import BASE_SPEC, INVALID_SPECS, METADATA_CASES, InvalidSpec, build

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def crd_installed(sandbox: Any) -> Iterator[None]:
    """Install the committed CRD (the one users apply), wait until it is served."""
    crd = yaml.safe_load((REPO / "crds" / "moedeployments.moe.inference.dev.yaml").read_text())
    assert crd == build_crd(), "committed CRD differs from the generated one: run moe-operator crds generate"
    install_crd(sandbox)
    yield


def _obj(name: str, spec: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "moe.inference.dev/v1alpha1",
        "kind": "MoEDeployment",
        "metadata": {"name": name, **(metadata or {})},
        "spec": spec,
    }


def _base(api: httpx.Client, namespace: str) -> str:
    return f"/apis/moe.inference.dev/v1alpha1/namespaces/{namespace}/moedeployments"


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.stem)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "create"])
def test_examples_are_accepted(
    crd_installed: None, api: httpx.Client, namespace: str, example: Path, dry_run: bool
) -> None:
    obj = yaml.safe_load(example.read_text())
    params = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
    resp = api.post(_base(api, namespace), json=obj, params=params)
    assert resp.status_code == 201, resp.text
    spec = resp.json()["spec"]
    assert spec["eplb"]["refreshInterval"], "defaults are filled in by the apiserver"


APISERVER_CASES = [c for c in INVALID_SPECS if c.layer in ("schema", "cel")]


@pytest.mark.parametrize("case", APISERVER_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_schema_and_cel_refuse_with_field(
    crd_installed: None, api: httpx.Client, namespace: str, case: InvalidSpec, dry_run: bool
) -> None:
    spec, old = build(case)
    base = _base(api, namespace)
    params = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
    if old is None:
        resp = api.post(base, json=_obj("bad", spec), params=params)
    else:
        created = api.post(base, json=_obj("bad", old), params={"fieldValidation": "Strict"})
        assert created.status_code == 201, created.text
        resp = replace_fresh(api, f"{base}/bad", lambda current: current.update(spec=spec), params)
        # The refused update changed nothing.
        assert api.get(f"{base}/bad").json()["spec"] == created.json()["spec"]
    assert resp.status_code in (400, 422), f"{case.name} accepted: {resp.status_code}"
    message = resp.json()["message"]
    # The refusal names the field; CEL messages (ours) also say what to change.
    assert case.field.removeprefix("spec.").split("[")[0].split(".")[-1] in message, message
    if case.layer == "cel":
        fixes = ("set ", "raise ", "choose ", "create a new", "needs ", "cannot exceed", "must be smaller")
        assert any(f in message for f in fixes), message


@pytest.mark.parametrize(
    ("name", "metadata", "field", "text"), METADATA_CASES, ids=[c[0] for c in METADATA_CASES]
)
def test_metadata_rules(
    crd_installed: None,
    api: httpx.Client,
    namespace: str,
    name: str,
    metadata: dict[str, Any],
    field: str,
    text: str,
) -> None:
    obj = _obj("x", copy.deepcopy(BASE_SPEC))
    obj["metadata"] = metadata
    resp = api.post(_base(api, namespace), json=obj)
    assert resp.status_code == 422
    assert text in resp.json()["message"]


WEBHOOK_CASES = [c for c in INVALID_SPECS if c.layer == "webhook"]


@pytest.mark.parametrize("case", WEBHOOK_CASES, ids=lambda c: c.name)
def test_webhook_refuses_with_field_and_fix(
    moe_operator: Any, api: httpx.Client, namespace: str, case: InvalidSpec
) -> None:
    """The operator's validating webhook, called by the real apiserver (create and dry-run)."""
    spec, old = build(case)
    base = _base(api, namespace)
    for params in ({"dryRun": "All"}, {}):
        if old is None:
            resp = api.post(base, json=_obj("bad", spec), params=params)
        else:
            created = api.post(base, json=_obj("bad", old))
            assert created.status_code in (201, 409), created.text
            resp = replace_fresh(api, f"{base}/bad", lambda current: current.update(spec=spec), params)
        assert resp.status_code == 422, f"{case.name}: {resp.status_code} {resp.text[:300]}"
        message = resp.json()["message"]
        field = case.field.split("[")[0].split(".")[-1]
        assert field in message, message
        if "admission webhook" in message:
            assert case.field in message and case.text in message, message
        # else an earlier layer (schema or CEL) refused it already: the earliest point wins.


def test_webhook_never_blocks_deletes(moe_operator: Any, api: httpx.Client, namespace: str) -> None:
    base = _base(api, namespace)
    assert api.post(base, json=_obj("ok", copy.deepcopy(BASE_SPEC))).status_code == 201
    config = api.get(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/moe.inference.dev"
    ).json()
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        for rule in hook["rules"]:
            assert "DELETE" not in rule["operations"] and "*" not in rule["operations"]
    assert api.delete(f"{base}/ok").status_code == 200
