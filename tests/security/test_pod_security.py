"""Which Pod Security level the pods the operator renders need, asked of the real API server's
PodSecurity admission (dry-run pod creates in namespaces that enforce each level), as
docs/security.md ("Engine pods") states it: engines pass baseline unless they get IPC_LOCK (RDMA),
the host network or a hostPath model volume (then privileged); routers pass restricted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from rendered import EXAMPLES, example_spec, rendered

from moe_operator.api import MoEDeploymentSpec
from moe_operator.render.engine_container import engine_needs_ipc_lock
from moe_sandbox.testing import wait_for

LEVELS = ("privileged", "baseline", "restricted")


def documented_engine_level(spec: MoEDeploymentSpec) -> str:
    """docs/security.md: baseline, unless the engine gets IPC_LOCK (RDMA), the host network or a
    hostPath model volume, each of which only privileged admits."""
    host_path = "hostPath" in (spec.model.volume or {})
    return (
        "privileged" if engine_needs_ipc_lock(spec) or spec.topology.host_network or host_path else "baseline"
    )


@pytest.fixture()
def level_namespaces(api: httpx.Client) -> Iterator[dict[str, str]]:
    """One namespace enforcing each Pod Security level."""
    suffix = uuid.uuid4().hex[:6]
    names = {level: f"psa-{suffix}-{level}" for level in LEVELS}
    for level, name in names.items():
        labels = {"pod-security.kubernetes.io/enforce": level}
        api.post("/api/v1/namespaces", json={"metadata": {"name": name, "labels": labels}}).raise_for_status()
    for name in names.values():
        wait_for(
            lambda n=name: api.get(f"/api/v1/namespaces/{n}/serviceaccounts/default").status_code == 200,
            30,
            what=f"{name} default ServiceAccount",
        )
    yield names
    for name in names.values():
        api.delete(f"/api/v1/namespaces/{name}")


def try_pod(api: httpx.Client, namespace: str, template: dict[str, Any], name: str) -> httpx.Response:
    """A dry-run create of the template's pod (what its controller would create)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": template["spec"]}

    def answer() -> httpx.Response | None:
        resp = api.post(f"/api/v1/namespaces/{namespace}/pods", params={"dryRun": "All"}, json=pod)
        # the ServiceAccount admission plugin reads a cache that sees a new account a moment later
        return None if "error looking up service account" in resp.text else resp

    got: httpx.Response = wait_for(answer, 30, what=f"{name}: ServiceAccount admission")
    return got


@pytest.mark.cluster
@pytest.mark.parametrize("example", EXAMPLES)
def test_pod_security_levels_of_rendered_pods(
    api: httpx.Client, level_namespaces: dict[str, str], example: str
) -> None:
    spec = example_spec(example)
    engine_level = documented_engine_level(spec)
    for level, namespace in level_namespaces.items():
        objects = rendered(example, namespace, name="m")
        for sa in (o for o in objects if o["kind"] == "ServiceAccount"):
            # without the owner reference: no MoEDeployment owns it here (the garbage collector would
            # delete it at once)
            account = {**sa, "metadata": {"name": sa["metadata"]["name"]}}
            api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", json=account).raise_for_status()
        engine_ok = LEVELS.index(level) <= LEVELS.index(engine_level)
        for obj in objects:
            if obj["kind"] not in ("StatefulSet", "Deployment"):
                continue
            resp = try_pod(api, namespace, obj["spec"]["template"], obj["metadata"]["name"])
            ok = engine_ok if obj["kind"] == "StatefulSet" else True  # routers pass restricted
            assert (resp.status_code == 201) == ok, (
                f"{example} {obj['metadata']['name']} in {level}: {resp.text}"
            )
            if not ok:
                assert "violates PodSecurity" in resp.text, resp.text
                message = resp.json()["message"]
                if level == "baseline" and engine_needs_ipc_lock(spec):
                    assert 'must not include "IPC_LOCK"' in message, message
                if level == "baseline" and spec.topology.host_network:
                    assert "hostNetwork=true" in message, message
                assert "NET_RAW" not in message and "SYS_RESOURCE" not in message, message
