"""spec.monitoring on the sandbox: a PodMonitor and a PrometheusRule per deployment, validated by the
Prometheus Operator's real CRDs (v0.85.0, from its module source), pruned when turned off, and an
event instead of an error where the CRDs are not served."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_reconciler import example, wait_ready

from moe_operator.api import MoEDeploymentSpec
from moe_operator.render.group import Owner
from moe_operator.render.monitoring import monitoring_objects
from moe_sandbox import prometheus_operator
from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, bind_model_volume, moed_path

pytestmark = pytest.mark.cluster
MON = "/apis/monitoring.coreos.com/v1/namespaces/{ns}/{plural}"


@pytest.fixture()
def with_prometheus_crds(sandbox: Sandbox, moe_operator: OperatorProcess) -> Iterator[None]:
    """The CRDs for this test only; the operator restarts around it (kopf watches what it saw at start)."""
    prometheus_operator.uninstall(sandbox)
    prometheus_operator.install(sandbox)
    moe_operator.restart()
    try:
        yield
    finally:
        prometheus_operator.uninstall(sandbox)
        moe_operator.restart()


def _deploy(api: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    bind_model_volume(api, namespace, "qwen3-30b-a3b")
    obj = example("qwen3-30b-a3b-single-node.yaml")
    obj["metadata"]["name"] = name
    obj["spec"]["monitoring"] = {"podMonitor": True, "prometheusRule": True}
    resp = api.post(moed_path(namespace), json=obj)
    assert resp.status_code == 201, resp.text
    return wait_ready(api, namespace, name)


def _events(api: httpx.Client, namespace: str, reason: str) -> list[str]:
    items = api.get(f"/api/v1/namespaces/{namespace}/events").json()["items"]
    return [e["message"] for e in items if e.get("reason") == reason]


def _within(rendered: Any, stored: Any, where: str = "spec") -> list[str]:
    """Where ``stored`` lost or changed something of ``rendered`` (the apiserver may add defaults)."""
    if isinstance(rendered, dict):
        if not isinstance(stored, dict):
            return [where]
        return [w for k, v in rendered.items() for w in _within(v, stored.get(k), f"{where}.{k}")]
    if isinstance(rendered, list):
        if not isinstance(stored, list) or len(stored) != len(rendered):
            return [where]
        return [
            w
            for i, (a, b) in enumerate(zip(rendered, stored, strict=True))
            for w in _within(a, b, f"{where}[{i}]")
        ]
    return [] if rendered == stored else [where]


def test_without_the_crds_monitoring_is_skipped_with_an_event(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess
) -> None:
    _deploy(api, namespace, "nomon")
    messages = wait_for(
        lambda: _events(api, namespace, "MonitoringSkipped"), 30, what="MonitoringSkipped event"
    )
    assert "does not serve monitoring.coreos.com/v1" in messages[0]
    assert "PodMonitor, PrometheusRule" in messages[0]


def test_monitoring_objects_pass_the_real_crds_and_follow_the_spec(
    api: httpx.Client, namespace: str, with_prometheus_crds: None
) -> None:
    obj = _deploy(api, namespace, "mon")
    owner = Owner("mon", namespace, obj["metadata"]["uid"])
    rendered = {
        o["kind"]: o for o in monitoring_objects(MoEDeploymentSpec.model_validate(obj["spec"]), owner)
    }

    def stored(plural: str, name: str) -> dict[str, Any] | None:
        resp = api.get(MON.format(ns=namespace, plural=plural) + f"/{name}")
        return resp.json() if resp.status_code == 200 else None

    for kind, plural in (("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules")):
        want = rendered[kind]
        have = wait_for(lambda p=plural, n=want["metadata"]["name"]: stored(p, n), 60, what=f"{kind} created")
        # The apiserver prunes what the CRD schema does not know (and adds defaults): nothing rendered
        # may be missing or changed.
        assert _within(want["spec"], have["spec"]) == [], kind
        assert have["metadata"]["ownerReferences"][0]["uid"] == owner.uid
    patch = {"spec": {"monitoring": {"podMonitor": False}}}
    headers = {"Content-Type": "application/merge-patch+json"}
    assert api.patch(moed_path(namespace, "mon"), json=patch, headers=headers).status_code == 200
    pm = rendered["PodMonitor"]["metadata"]["name"]
    wait_for(lambda: stored("podmonitors", pm) is None, 60, what="PodMonitor pruned")
    assert stored("prometheusrules", rendered["PrometheusRule"]["metadata"]["name"]) is not None
