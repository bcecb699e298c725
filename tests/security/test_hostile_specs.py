"""Hostile MoEDeployment specs (issue 15): each is refused at admission with a message that names the
field and says what the platform allows (offline by `validate` and `moe-operator crds validate`,
on the sandbox by the real operator's webhook or, for bounds, by the CRD itself), and the pods and
workloads such a spec would render, applied raw under the operator's ServiceAccount (a webhook
outage, an operator bug), are refused by the ValidatingAdmissionPolicy moe-operator-pods; the
rendered children of every example are admitted by the same policy.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_contract import pod as P
from moe_operator.api import MoEDeploymentSpec
from moe_operator.cli import run as run_cli
from moe_operator.cli.crds import register
from moe_operator.cli.plan import load_nodes
from moe_operator.render.children import render_children
from moe_operator.render.group import GroupBackend, Owner, RuntimeSettings
from moe_operator.topology.planner import plan_topology
from moe_operator.topology.requests import pool_requests, topology_policy
from moe_operator.topology.snapshot import node_from_object
from moe_operator.validation import PlatformPolicy, validate
from moe_operator.validation.platform import PROTECTED_HOST_PATHS, VOLUME_SOURCES
from moe_operator.validation.pod_rules import RESERVED_ENV
from moe_sandbox.cluster import Sandbox, server_side_apply
from moe_sandbox.pki import issue_client_cert
from moe_sandbox.testing import wait_for
from moe_sandbox.toolchain import binary_path
from operator_harness import OperatorProcess, moed_path

ROOT = Path(__file__).resolve().parents[2]
ADMISSION = ROOT / "policies" / "admission"
ADMISSIONREG = "/apis/admissionregistration.k8s.io/v1"
POLICY = "moe-operator-pods"
OPERATOR_SA = "system:serviceaccount:moe-system:moe-operator"  # the username the shipped policy matches
SCOPE_LABEL = "moe.inference.dev/hostile-spec-test"
PARAMS = "moe-platform-hostile-specs"
BINDING = "moe-operator-pods-hostile-specs"
# The platform of the policy tests: the examples' grants (hostNetwork, node-local weights) in the
# examples' namespace only; the hostile specs are applied in another namespace.
EXAMPLES_NS_PREFIX = "moe-examples-"
TEST_PLATFORM = PlatformPolicy(
    host_path_prefixes=("/raid/models",), host_network_namespaces=(f"{EXAMPLES_NS_PREFIX}*",)
)
WORKLOAD_PATHS = {
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets",
    "Pod": "/api/v1/namespaces/{ns}/pods",
}


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


BASE = example("qwen3-30b-a3b-single-node.yaml")["spec"]


@dataclass(frozen=True)
class Hostile:
    """A spec an attacker (or a careless author) submits: a merge patch on BASE and what the
    refusal must say. ``pods``: what the admission policy's refusal of its rendered pods names
    (None: a bound, enforced by the CRD itself, which no pod shows)."""

    name: str
    patch: dict[str, Any]
    field: str
    allowed: str
    pods: str | None


def _volume(source: dict[str, Any]) -> dict[str, Any]:
    return {"model": {"volume": {"persistentVolumeClaim": None, **source}}}


def _env(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"engine": {"env": list(entries)}}


HOSTILE: tuple[Hostile, ...] = (
    Hostile("hostpath-root", _volume({"hostPath": {"path": "/"}}), "spec.model.volume.hostPath.path",
            "host paths the platform allows lie under:", "hostPath /"),
    Hostile("hostpath-containerd-socket", _volume({"hostPath": {"path": "/var/run/containerd"}}),
            "spec.model.volume.hostPath.path", "reaches /var/run", "hostPath /var/run/containerd"),
    Hostile("hostpath-kubelet", _volume({"hostPath": {"path": "/var/lib/kubelet"}}),
            "spec.model.volume.hostPath.path", "reaches /var/lib/kubelet", "hostPath /var/lib/kubelet"),
    Hostile("hostpath-kubelet-pods", _volume({"hostPath": {"path": "/var/lib/kubelet/pods"}}),
            "spec.model.volume.hostPath.path", "reaches /var/lib/kubelet", "hostPath /var/lib/kubelet/pods"),
    Hostile("hostpath-etc", _volume({"hostPath": {"path": "/etc", "type": "Directory"}}),
            "spec.model.volume.hostPath.path", "host paths the platform allows lie under:", "hostPath /etc"),
    Hostile("hostpath-dotdot-escape", _volume({"hostPath": {"path": "/raid/models/../../etc"}}),
            "spec.model.volume.hostPath.path", "not in normal form", "hostPath /raid/models/../../etc"),
    Hostile("hostpath-outside-prefix", _volume({"hostPath": {"path": "/data/other-tenant"}}),
            "spec.model.volume.hostPath.path", "host paths the platform allows lie under:",
            "hostPath /data/other-tenant"),
    Hostile("hostpath-created-on-node",
            _volume({"hostPath": {"path": "/raid/models/new", "type": "DirectoryOrCreate"}}),
            "spec.model.volume.hostPath.type", "use Directory or File", "hostPath /raid/models/new"),
    Hostile("secret-volume", _volume({"secret": {"secretName": "db-credentials"}}), "spec.model.volume.secret",
            "the platform allows persistentVolumeClaim", "Secret db-credentials"),
    Hostile("configmap-volume", _volume({"configMap": {"name": "kube-root-ca.crt"}}),
            "spec.model.volume.configMap", "the platform allows persistentVolumeClaim", "ConfigMap kube-root-ca.crt"),
    Hostile("projected-serviceaccount-token",
            _volume({"projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault"}}]}}),
            "spec.model.volume.projected", "the platform allows persistentVolumeClaim", "model (projected)"),
    Hostile("env-secret-of-another-app",
            _env({"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db-credentials", "key": "pw"}}}),
            "spec.engine.env[0].valueFrom.secretKeyRef.name", "allowed Secret names:",
            "DB_PASSWORD from Secret db-credentials"),
    Hostile("env-runtime-token-secret",
            _env({"name": "T", "valueFrom": {"secretKeyRef": {"name": "qwen3-30b-runtime-token", "key": "token"}}}),
            "spec.engine.env[0].valueFrom.secretKeyRef.name", "allowed Secret names:",
            "T from Secret qwen3-30b-runtime-token"),
    Hostile("env-configmap-of-another-app",
            _env({"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "billing-config", "key": "url"}}}),
            "spec.engine.env[0].valueFrom.configMapKeyRef.name", "allowed ConfigMap names:",
            "CFG from ConfigMap billing-config"),
    Hostile("env-pythonpath-override", _env({"name": "PYTHONPATH", "value": "/models/evil"}),
            "spec.engine.env[0].name", "are reserved", "engine: PYTHONPATH"),
    Hostile("env-moe-rank-override", _env({"name": "MOE_RANK", "value": "0"}), "spec.engine.env[0].name",
            "are reserved", "engine: MOE_RANK"),
    Hostile("env-moe-placement-file", _env({"name": "MOE_PLACEMENT_FILE", "value": "/tmp/p.json"}),
            "spec.engine.env[0].name", "are reserved", "engine: MOE_PLACEMENT_FILE"),
    Hostile("env-sglang-host-ip", _env({"name": "SGLANG_HOST_IP", "value": "10.0.0.1"}),
            "spec.engine.env[0].name", "are reserved", "engine: SGLANG_HOST_IP"),
    Hostile("env-lws-worker-index", _env({"name": "LWS_WORKER_INDEX", "value": "0"}), "spec.engine.env[0].name",
            "are reserved", "engine: LWS_WORKER_INDEX"),
    Hostile("toleration-exists-on-everything", {"topology": {"tolerations": [{"operator": "Exists"}]}},
            "spec.topology.tolerations[0].key", "name a taint the platform allows:", "every taint (no key) Exists"),
    Hostile("toleration-control-plane",
            {"topology": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
            "spec.topology.tolerations[0].key", "allowed taint keys:", "node-role.kubernetes.io/control-plane"),
    Hostile("host-network-without-permission", {"topology": {"hostNetwork": True}}, "spec.topology.hostNetwork",
            "(platform.hostNetworkNamespaces)", "hostNetwork"),
    Hostile("refresh-interval-1s", {"eplb": {"refreshInterval": "1s"}}, "spec.eplb.refreshInterval",
            "must be a duration from 10s to 24h", None),
    Hostile("history-1000h", {"eplb": {"history": "1000h"}}, "spec.eplb.history",
            "must be a duration from 1m to 24h", None),
    Hostile("startup-timeout-forever", {"engine": {"startupTimeout": "9999h"}}, "spec.engine.startupTimeout",
            "must be a duration from 1m to 4h", None),
    Hostile("alert-for-zero", {"monitoring": {"alertFor": "0s"}}, "spec.monitoring.alertFor",
            "must be a duration from 1m to 24h", None),
    Hostile("decode-replicas-100000", {"decode": {"replicas": 100000}}, "spec.decode.replicas",
            "less than or equal to 256", None),
    Hostile("router-replicas-10000", {"router": {"replicas": 10000}}, "spec.router.replicas",
            "less than or equal to 64", None),
)  # fmt: skip
POD_CASES = [h for h in HOSTILE if h.pods is not None]
# The Pod API's own validation refuses these before any admission policy runs.
API_VALIDATES = {"hostpath-dotdot-escape": "must not contain '..'"}


def merge(target: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def hostile_spec(case: Hostile) -> dict[str, Any]:
    spec: dict[str, Any] = merge(BASE, case.patch)
    return spec


def manifest(case: Hostile, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "qwen3-30b"}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "moe.inference.dev/v1alpha1", "kind": "MoEDeployment", "metadata": meta,
            "spec": hostile_spec(case)}  # fmt: skip


def check_message(case: Hostile, message: str) -> None:
    assert case.field in message, f"{case.name}: the refusal must name {case.field}: {message}"
    assert f"{case.field}: {case.field}" not in message, f"{case.name}: the field is repeated: {message}"
    assert case.allowed in message, (
        f"{case.name}: the refusal must say what is allowed ({case.allowed!r}): {message}"
    )


# ---- offline: the rules and the CLI ----------------------------------------------------------------


def test_enough_hostile_specs() -> None:
    assert len({h.name for h in HOSTILE}) == len(HOSTILE) >= 25
    assert len(POD_CASES) >= 20


def test_the_base_spec_is_admitted() -> None:
    assert validate(BASE, namespace="hostile") == []


@pytest.mark.parametrize("case", HOSTILE, ids=lambda h: h.name)
def test_validate_refuses_with_field_and_what_is_allowed(case: Hostile) -> None:
    problems = validate(hostile_spec(case), namespace="hostile")
    mine = [p for p in problems if p.field == case.field]
    assert mine, f"nothing on {case.field}: {[str(p) for p in problems]}"
    check_message(case, str(mine[0]))
    # the same under the policy the sandbox tests use: the examples' grants are not the hostile namespace's
    assert [p for p in validate(hostile_spec(case), None, TEST_PLATFORM, "hostile") if p.field == case.field]


def test_crds_validate_refuses_every_hostile_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hostile.yaml"
    docs = []
    for case in HOSTILE:
        doc = manifest(case)
        doc["metadata"]["name"] = case.name
        docs.append(doc)
    path.write_text(yaml.safe_dump_all(docs))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["crds", "validate", "-n", "hostile", str(path)])
    assert args.func(args) == 1
    out = capsys.readouterr().out
    blocks = re.split(rf"^{re.escape(str(path))}: ", out, flags=re.M)[1:]
    by_name = {b.split(":", 1)[0]: b for b in blocks}
    assert set(by_name) == {h.name for h in HOSTILE}
    for case in HOSTILE:
        assert "problem(s)" in by_name[case.name].splitlines()[0], by_name[case.name]
        check_message(case, by_name[case.name])


def test_policy_file_vocabulary_matches_the_rules() -> None:
    """The admission policy's fixed lists are the webhook rules' lists (no drift between layers)."""
    policy = next(d for d in yaml.safe_load_all((ADMISSION / "operator-pods.yaml").read_text()) if d)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}

    def literal_list(name: str) -> list[str]:
        return re.findall(r"'([^']*)'", variables[name])

    assert literal_list("protectedPaths") == list(PROTECTED_HOST_PATHS)
    assert set(literal_list("launcherEnv")) == {n for n in RESERVED_ENV if n.startswith("SGLANG_")}
    listed = set(
        re.findall(r"has\(v\.(\w+)\) && '(\w+)' in variables\.volumeSources", variables["badVolumes"])
    )
    # emptyDir is always admitted there: the operator's own runtime and /dev/shm volumes are emptyDirs
    assert {a for a, b in listed if a == b} == set(VOLUME_SOURCES) - {"emptyDir"}
    # what the operator itself sets in every engine container is what the policy lets through once
    rendered = {
        e["name"]
        for obj in render(BASE, "qwen3-30b", "default")
        if obj["kind"] == "StatefulSet"
        for c in obj["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
    }
    # the recipe's variables (fabric, DeepEP cap) are neither the operator's MOE_* nor the runtime's:
    # the policy lets them through unlisted, and none may carry a name it refuses
    from moe_operator.hardware import load_profiles

    recipe = {e.name for p in load_profiles().values() for e in p.env} | {
        "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "MC_FORCE_MNNVL",
        "SGLANG_CACHE_DIR", "KERNEL_CACHE_NODE",
    }  # fmt: skip
    assert not {n for n in recipe if n.startswith(("MOE_", "LWS_")) or n in literal_list("launcherEnv")}
    assert set(literal_list("operatorEnv")) == rendered - recipe
    assert {P.ENV_POD_IP, P.ENV_POD_NAME, "PYTHONPATH"} <= rendered
    # the shipped parameters are the operator's defaults
    params = next(
        d
        for d in yaml.safe_load_all((ADMISSION / "params.yaml").read_text())
        if d["metadata"]["name"] == "moe-platform"
    )
    assert params["data"] == PlatformPolicy().to_params()
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert f"request.userInfo.username == '{OPERATOR_SA}'" in condition


# ---- rendering without admission (what an operator bug or a webhook outage would apply) ----------


def render(
    spec: dict[str, Any], name: str, namespace: str, backend: GroupBackend = "StatefulSet"
) -> list[dict[str, Any]]:
    """Every child of ``spec``, rendered with no admission rule at all (the pydantic parse only)."""
    parsed = MoEDeploymentSpec.model_validate(spec)
    owner = Owner(name, namespace, str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")))
    nodes = [node_from_object(o) for o in load_nodes(None)]
    plan = plan_topology(pool_requests(parsed), nodes, topology_policy(parsed))
    return render_children(
        parsed, owner, plan, RuntimeSettings(runtime_image="moe-runtime:test"), None, backend
    )


def workloads(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] in ("StatefulSet", "Deployment", "LeaderWorkerSet")]


def pods_of(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods its controller would create (the template, named), one per template."""
    spec = workload["spec"]
    if workload["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        templates = [lwt["workerTemplate"], *([lwt["leaderTemplate"]] if "leaderTemplate" in lwt else [])]
    else:
        templates = [spec["template"]]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{workload['metadata']['name']}-{i}", "labels": t["metadata"]["labels"]},
            "spec": copy.deepcopy(t["spec"]),
        }
        for i, t in enumerate(templates)
    ]


# ---- the sandbox --------------------------------------------------------------------------------


def user_client(box: Sandbox, user: str) -> httpx.Client:
    """A client authenticated as ``user`` (a client certificate; admin rights, so only admission refuses)."""
    crt, key = issue_client_cert(box.pki, "user-" + re.sub(r"[^a-z0-9-]", "-", user), user)
    ctx = ssl.create_default_context(cafile=str(box.pki.ca_cert))
    ctx.load_cert_chain(str(crt), str(key))
    return httpx.Client(base_url=box.server, verify=ctx, timeout=30)


def _policy_objects() -> list[dict[str, Any]]:
    policy, binding = [d for d in yaml.safe_load_all((ADMISSION / "operator-pods.yaml").read_text()) if d]
    binding = copy.deepcopy(binding)
    binding["metadata"]["name"] = BINDING
    binding["spec"]["paramRef"]["name"] = PARAMS
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {SCOPE_LABEL: "true"}}}
    params = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PARAMS, "namespace": "moe-system"},
        "data": TEST_PLATFORM.to_params(),
    }
    return [params, policy, binding]


def _path(obj: dict[str, Any]) -> str:
    name = obj["metadata"]["name"]
    if obj["kind"] == "ConfigMap":
        return f"/api/v1/namespaces/moe-system/configmaps/{name}"
    plural = (
        "validatingadmissionpolicies"
        if obj["kind"] == "ValidatingAdmissionPolicy"
        else "validatingadmissionpolicybindings"
    )
    return f"{ADMISSIONREG}/{plural}/{name}"


def _namespace(api: httpx.Client, prefix: str) -> str:
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    resp = api.post("/api/v1/namespaces", json={"metadata": {"name": name, "labels": {SCOPE_LABEL: "true"}}})
    resp.raise_for_status()
    wait_for(lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200, 30)
    return name


def unowned(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without its ownerReferences: rendered children are owned by a MoEDeployment that does
    not exist here, and the garbage collector deletes what is really created with such an owner."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("ownerReferences", None)
    return out


def create_service_accounts(api: httpx.Client, namespace: str, children: list[dict[str, Any]]) -> None:
    """The ServiceAccounts the rendered pods run as (the ServiceAccount admission plugin refuses pods
    whose account is missing, before any policy runs)."""
    for sa in [c for c in children if c["kind"] == "ServiceAccount"]:
        resp = api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", json=unowned(sa))
        assert resp.status_code in (201, 409), resp.text


@pytest.fixture(scope="module")
def platform(sandbox: Sandbox) -> Iterator[dict[str, str]]:
    """The policy with the test platform's parameters, bound to two fresh namespaces: ``hostile`` (no
    grants) and ``examples`` (hostNetwork and /raid/models granted)."""
    with sandbox.client(timeout=30) as api:
        if api.get("/api/v1/namespaces/moe-system").status_code == 404:
            api.post("/api/v1/namespaces", json={"metadata": {"name": "moe-system"}}).raise_for_status()
        objects = _policy_objects()
        for obj in objects:
            server_side_apply(api, _path(obj), obj, "moe-hostile-spec-tests")
        spaces = {"hostile": _namespace(api, "hostile-"), "examples": _namespace(api, EXAMPLES_NS_PREFIX)}
        try:
            children = render(hostile_spec(HOSTILE[0]), "qwen3-30b", spaces["hostile"])
            create_service_accounts(api, spaces["hostile"], children)
            probe = pods_of(workloads(children)[0])[0]
            wait_for(lambda: refusal(api, spaces["hostile"], probe) is not None, 30, what="the policy to act")
            yield spaces
        finally:
            for ns in spaces.values():
                api.delete(f"/api/v1/namespaces/{ns}")
            for obj in reversed(objects):
                api.delete(_path(obj))


def create(client: httpx.Client, namespace: str, obj: dict[str, Any]) -> httpx.Response:
    return client.post(WORKLOAD_PATHS[obj["kind"]].format(ns=namespace), params={"dryRun": "All"}, json=obj)


def refusal(
    client: httpx.Client, namespace: str, obj: dict[str, Any], by_api: str | None = None
) -> str | None:
    """The policy's message if it refuses ``obj`` (or the API's own, containing ``by_api``); None if
    admitted. Any other answer fails the test."""
    resp = create(client, namespace, obj)
    if resp.status_code in (200, 201):
        return None
    assert resp.status_code in (403, 422), resp.text
    message = str(resp.json()["message"])
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in message or (by_api and by_api in message), message
    return message


@pytest.mark.cluster
def test_policy_type_checks_cleanly(platform: dict[str, str], api: httpx.Client) -> None:
    def checked() -> dict[str, Any] | None:
        live: dict[str, Any] = api.get(f"{ADMISSIONREG}/validatingadmissionpolicies/{POLICY}").json()
        status: dict[str, Any] = live.get("status", {})
        return status if status.get("observedGeneration") == live["metadata"]["generation"] else None

    status = wait_for(checked, 30, what="type checking of the policy")
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


@pytest.fixture(scope="module")
def webhook(moe_operator: OperatorProcess, platform: dict[str, str], sandbox: Sandbox) -> OperatorProcess:
    """The operator's webhook, once the apiserver calls it (its configuration is picked up
    asynchronously, and failurePolicy Ignore admits everything until then)."""
    probe = manifest(HOSTILE[0])

    def refusing() -> bool:
        with sandbox.client(timeout=30) as api:
            resp = api.post(moed_path(platform["hostile"]), json=probe, params={"dryRun": "All"})
        assert resp.status_code in (201, 422), resp.text
        return resp.status_code == 422

    wait_for(refusing, 60, what="the operator's webhook to be called")
    return moe_operator


@pytest.mark.cluster
@pytest.mark.parametrize("case", HOSTILE, ids=lambda h: h.name)
def test_webhook_refuses_hostile_spec(
    webhook: OperatorProcess, platform: dict[str, str], api: httpx.Client, case: Hostile
) -> None:
    """Through the real apiserver and the real operator's webhook; bounds are refused by the CRD's own
    schema and CEL rules, before the webhook (so also while it is down)."""
    ns = platform["hostile"]
    for params in ({"dryRun": "All"}, {}):
        resp = api.post(moed_path(ns), json=manifest(case), params=params)
        assert resp.status_code == 422, f"{case.name} admitted: {resp.status_code} {resp.text[:300]}"
        message = resp.json()["message"]
        if case.pods is None:
            assert "admission webhook" not in message, f"the CRD itself must refuse {case.name}: {message}"
            assert case.field.removeprefix("spec.") in message and case.allowed in message, message
        else:
            assert "admission webhook" in message, message
            check_message(case, message)
    assert api.get(moed_path(ns, "qwen3-30b")).status_code == 404


@pytest.mark.cluster
@pytest.mark.parametrize("case", POD_CASES, ids=lambda h: h.name)
def test_policy_refuses_rendered_workloads_and_pods(
    sandbox: Sandbox, platform: dict[str, str], case: Hostile
) -> None:
    """The children of a hostile spec, rendered as if admission had let it through, applied by the
    operator's ServiceAccount (workloads) and as their controllers would create them (pods)."""
    ns = platform["hostile"]
    engines = [
        w for w in workloads(render(hostile_spec(case), "qwen3-30b", ns)) if w["kind"] == "StatefulSet"
    ]
    assert engines
    with user_client(sandbox, OPERATOR_SA) as op, sandbox.client(timeout=30) as controller:
        by_api = API_VALIDATES.get(case.name)
        for workload in engines:
            message = refusal(op, ns, workload, by_api)
            assert message is not None and (by_api or case.pods) in message, f"{case.name}: {message}"
            assert by_api or "allowed" in message, message
            for pod in pods_of(workload):
                # pods come from the StatefulSet controller, not the operator: matched by their label
                message = refusal(controller, ns, pod, by_api)
                assert message is not None and (by_api or case.pods) in message, f"{case.name} pod: {message}"


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_policy_admits_rendered_examples(
    sandbox: Sandbox, platform: dict[str, str], api: httpx.Client, name: str
) -> None:
    ns = platform["examples"]
    doc = example(name)
    assert validate(doc["spec"], None, TEST_PLATFORM, ns) == []
    children = render(doc["spec"], doc["metadata"]["name"], ns)
    create_service_accounts(api, ns, children)
    with user_client(sandbox, OPERATOR_SA) as op:
        for workload in workloads(children):
            assert refusal(op, ns, workload) is None
            for pod in pods_of(workload):
                assert refusal(api, ns, pod) is None


@pytest.mark.cluster
def test_policy_refuses_hostile_pods_a_controller_creates(
    platform: dict[str, str], api: httpx.Client
) -> None:
    """A StatefulSet the policy does not match (no label, not the operator's user) whose template is an
    engine pod with the node's root mounted: the StatefulSet controller's pod creation is refused."""
    ns = platform["hostile"]
    (sts,) = [
        w for w in workloads(render(hostile_spec(HOSTILE[0]), "qwen3-30b", ns)) if w["kind"] == "StatefulSet"
    ]
    sts["metadata"] = {"name": "unlabelled", "namespace": ns}
    assert api.post(f"/apis/apps/v1/namespaces/{ns}/statefulsets", json=sts).status_code == 201

    def refused_event() -> str | None:
        events = api.get(
            f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "reason=FailedCreate"}
        ).json()
        texts = [e["message"] for e in events["items"] if e["involvedObject"]["name"] == "unlabelled"]
        return next((t for t in texts if POLICY in t), None)

    message = wait_for(refused_event, 60, what="the StatefulSet controller's pod to be refused")
    assert "hostPath /" in message
    pods = api.get(
        f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": "app.kubernetes.io/managed-by"}
    ).json()
    assert not [p for p in pods["items"] if p["metadata"]["name"].startswith("unlabelled")]


# ---- the chart: one set of platform values for the operator's flags and the policy's parameters ----

CHART = ROOT / "charts" / "moe-operator"


def test_chart_policy_copy_matches_the_policy_file() -> None:
    copy_ = CHART / "files" / "operator-pods.yaml"
    assert copy_.read_bytes() == (ADMISSION / "operator-pods.yaml").read_bytes(), (
        f"{copy_} drifted: copy it again"
    )


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["platform.hostPathPrefixes={/raid/models}", "platform.hostNetworkNamespaces={rdma-*,team-b}",
         "platform.envSecretNames={hf-token*}", "platform.tolerationKeys={nvidia.com/gpu,dedicated}"],
    ],
    ids=["defaults", "granted"],
)  # fmt: skip
def test_chart_platform_values_drive_the_operator_and_the_policy(tmp_path: Path, sets: list[str]) -> None:
    values = tmp_path / "values.yaml"
    args = ["template", "moe", str(CHART), "--namespace", "moe-system"]
    for s in sets:
        args += ["--set", s]
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "cfg"),
    }
    out = subprocess.run(
        [str(binary_path("helm")), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    shown = subprocess.run(
        [str(binary_path("helm")), "show", "values", str(CHART)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    chart_values = yaml.safe_load(shown.stdout)
    for s in sets:  # --set a.b={x,y}: the same on the values file
        key, _, items = s.partition("=")
        chart_values["platform"][key.split(".")[1]] = items.strip("{}").split(",")
    values.write_text(yaml.safe_dump(chart_values))
    expected = PlatformPolicy.from_file(values)
    # the operator's flags
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers(dest="command"))
    parsed = parser.parse_args(["run", *container["args"]])
    flags = PlatformPolicy.from_args(parsed)
    assert flags == PlatformPolicy(**{**expected.__dict__, "capabilities": flags.capabilities})
    # the policy's parameters and its match on the release's ServiceAccount
    (params,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-platform")]
    assert params["data"] == expected.to_params()
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["paramRef"] == {
        "name": params["metadata"]["name"], "namespace": "moe-system", "parameterNotFoundAction": "Deny",
    }  # fmt: skip
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    source = next(d for d in yaml.safe_load_all((ADMISSION / "operator-pods.yaml").read_text()) if d)
    source["spec"]["matchConditions"][0]["expression"] = source["spec"]["matchConditions"][0][
        "expression"
    ].replace(OPERATOR_SA, f"system:serviceaccount:moe-system:{sa}")
    assert policy["spec"] == source["spec"]


@pytest.fixture()
def leaderworkerset(sandbox: Sandbox, moe_operator: OperatorProcess) -> Iterator[None]:
    """The real LeaderWorkerSet controller and webhooks for one test (the operator is not asked to
    use them: it only uses what was served when it started). Afterwards the session's operator
    restarts: kopf watches the CRD once it appears, and its deletion can stop the operator
    (docs/operator.md, Optional APIs)."""
    from moe_sandbox import leaderworkerset as lws

    lws.uninstall(sandbox)
    lws.install(sandbox)
    try:
        yield
    finally:
        lws.uninstall(sandbox)
        moe_operator.restart()


@pytest.mark.cluster
def test_policy_with_real_leaderworkersets(
    sandbox: Sandbox, platform: dict[str, str], api: httpx.Client, leaderworkerset: None
) -> None:
    """A rendered LeaderWorkerSet of the gb200 example, created by the operator's ServiceAccount: the
    LeaderWorkerSet controller's pods (with the LWS_* environment its webhook adds) are admitted; the
    same LeaderWorkerSet with the node's root mounted is refused."""
    ns = platform["examples"]
    doc = example("deepseek-v3-gb200.yaml")
    children = render(doc["spec"], doc["metadata"]["name"], ns, backend="LeaderWorkerSet")
    create_service_accounts(api, ns, children)
    lws_obj = unowned(next(c for c in children if c["kind"] == "LeaderWorkerSet"))
    size = lws_obj["spec"]["leaderWorkerTemplate"]["size"]
    name = lws_obj["metadata"]["name"]
    path = WORKLOAD_PATHS["LeaderWorkerSet"].format(ns=ns)
    hostile = copy.deepcopy(lws_obj)
    template = hostile["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    model = next(v for v in template["volumes"] if v["name"] == "model")
    model["hostPath"]["path"] = "/"
    with user_client(sandbox, OPERATOR_SA) as op:
        message = wait_for(lambda: refusal(op, ns, hostile), 60, what="the hostile LeaderWorkerSet refused")
        assert "model (hostPath /)" in message
        resp = op.post(path, json=lws_obj)
        assert resp.status_code == 201, resp.text

    def pods() -> list[dict[str, Any]] | None:
        found = api.get(
            f"/api/v1/namespaces/{ns}/pods",
            params={"labelSelector": f"leaderworkerset.sigs.k8s.io/name={name}"},
        ).json()["items"]
        return found if len(found) == size else None

    try:
        created = wait_for(pods, 120, interval=1, what=f"{size} pods of the LeaderWorkerSet")
    except AssertionError as exc:  # say why: a refusal by the policy shows as a FailedCreate event
        events = api.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
        raise AssertionError(
            f"{exc}; events: {[(e['reason'], e['message']) for e in events][-10:]}"
        ) from None
    env = {e["name"] for e in created[0]["spec"]["containers"][0]["env"]}
    assert {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"} <= env, env
    api.delete(f"{path}/{name}")
