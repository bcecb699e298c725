"""The Helm chart (charts/moe-operator): lint, golden renders, schema, RBAC, copies that must not drift,
and an install into the sandbox whose ServiceAccount is shown sufficient by running the real operator
with the ServiceAccount's own token."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from moe_sandbox.toolchain import binary_path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "moe-operator"
GOLDEN = Path(__file__).resolve().parent / "golden"
RELEASE = "moe"
NAMESPACE = "moe-system"
MONITORING_ON = [
    "monitoring.podMonitor.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.enginePodMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.grafanaDashboard.enabled=true",
]
MOED = "/apis/moe.inference.dev/v1alpha1"
WEBHOOK_CONFIG = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/moe.inference.dev"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = binary_path("helm")
    assert exe.exists(), f"{exe} missing: build it with `moe-sandbox build` (e2e/setup.sh does)"
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/moe-helm/cache", "HELM_CONFIG_HOME": "/tmp/moe-helm/config"}
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def template(*sets: str) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    return helm(*args).stdout


def objects(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (
        f"{len(found)} {kind} objects named {name}: {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


# ---- static: lint, golden, schema -----------------------------------------------------------------


def test_lint_strict() -> None:
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), *[a for s in MONITORING_ON for a in ("--set", s)])


@pytest.mark.parametrize(("golden", "sets"), [("default.yaml", []), ("monitoring.yaml", MONITORING_ON)])
def test_golden_render(golden: str, sets: list[str]) -> None:
    rendered = template(*sets)
    path = GOLDEN / golden
    if os.environ.get("MOE_UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} missing: regenerate with MOE_UPDATE_GOLDEN=1"
    assert rendered == path.read_text(), f"{path} is stale: regenerate with MOE_UPDATE_GOLDEN=1 and review"


def test_defaults_render_no_monitoring_objects() -> None:
    kinds = sorted(d["kind"] for d in objects(template()))
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("webhook.port=notaport", "/webhook/port"),
        ("operator.metricsPort=70000", "/operator/metricsPort"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("monitoring.podMonitor.interval=soon", "/monitoring/podMonitor/interval"),
        ("replicas=2", "replicas"),
        ("webhook.enable=true", "enable"),
    ],
)
def test_schema_rejects_bad_values(setting: str, message: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


# ---- the operator Deployment and Service --------------------------------------------------------


def test_deployment_runs_the_operator_safely() -> None:
    docs = objects(template())
    dep = one(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["requests"] and c["resources"]["limits"]
    # The image's ENTRYPOINT is `moe-operator run`: args are the flags only.
    assert c["args"][0].startswith("--")
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"] if "=" in a)
    svc = one(docs, "Service")
    assert args["webhook-addr"] == "0.0.0.0"
    assert args["webhook-host"] == f"{svc['metadata']['name']}.{NAMESPACE}.svc"
    assert args["webhook-port"] == "9443"
    assert args["metrics-port"] == "9100"
    assert args["runtime-image"] == "ghcr.io/moe-inference/moe-runtime:0.1.0"
    assert args["liveness"] == "http://0.0.0.0:8080/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports[get["port"]] == 8080
    # The generated webhook PKI goes to $XDG_CACHE_HOME/moe-operator: a writable emptyDir.
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert env["XDG_CACHE_HOME"] == f"{env['HOME']}/.cache"
    cache_volume = mounts[env["XDG_CACHE_HOME"]]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == cache_volume)
    # Service: 443 -> the webhook port, and metrics.
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc_ports["webhook"]["port"] == 443 and ports[svc_ports["webhook"]["targetPort"]] == 9443
    assert ports[svc_ports["metrics"]["targetPort"]] == 9100
    assert svc["spec"]["selector"] == spec["selector"]["matchLabels"]


def test_webhook_disabled_and_cert_secret() -> None:
    docs = objects(template("webhook.enabled=false"))
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--no-webhook" in c["args"]
    assert not any(a.startswith("--webhook") for a in c["args"])
    rules = one(docs, "ClusterRole")["rules"]
    assert not any("admissionregistration.k8s.io" in r["apiGroups"] for r in rules)

    docs = objects(template("webhook.certSecret=moe-webhook-tls"))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--webhook-cert=/etc/moe-operator/webhook-tls/tls.crt" in c["args"]
    assert "--webhook-ca=/etc/moe-operator/webhook-tls/ca.crt" in c["args"]
    assert {"name": "webhook-tls", "secret": {"secretName": "moe-webhook-tls"}} in pod["volumes"]


# ---- RBAC ---------------------------------------------------------------------------------------

EXPECTED_RULES: dict[tuple[str, str], set[str]] = {
    ("moe.inference.dev", "moedeployments"): {"get", "list", "watch", "patch", "update"},
    ("moe.inference.dev", "moedeployments/status"): {"get", "patch", "update"},
    ("", "nodes"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch", "delete", "deletecollection"},
    **{
        (g, r): {"get", "list", "watch", "create", "patch", "delete"}
        for g, r in [
            ("", "services"),
            ("", "configmaps"),
            ("", "serviceaccounts"),
            ("apps", "statefulsets"),
            ("apps", "deployments"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("policy", "poddisruptionbudgets"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
        ]
    },
    ("", "secrets"): {"get", "create"},  # the runtime token only: never listed or watched
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {
        "get",
        "list",
        "watch",
        "create",
        "patch",
    },
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {
        "get",
        "list",
        "watch",
        "create",
        "patch",
    },
}


def granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_is_least_privilege_without_wildcards() -> None:
    docs = objects(template())
    role = one(docs, "ClusterRole")
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert not any("*" in v for v in rule[field]), f"wildcard in {field}: {rule}"
    assert granted(role["rules"]) == EXPECTED_RULES
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert not any(d["kind"] in ("Role", "RoleBinding") for d in docs)


def test_rbac_covers_every_kind_the_operator_writes() -> None:
    from moe_operator.handlers.kube import _KINDS

    rules = granted(one(objects(template()), "ClusterRole")["rules"])
    for (api_version, _kind), (_prefix, plural) in _KINDS.items():
        group = api_version.rpartition("/")[0]
        needed = {
            "moedeployments": {"get", "patch"},
            "pods": {
                "get",
                "delete",
                "deletecollection",
            },  # groups deleted at once; lost-node pods one by one
            "secrets": {"get", "create"},  # the runtime token: created once, never patched or deleted
        }.get(plural, {"get", "create", "patch", "delete"})
        assert needed <= rules.get((group, plural), set()), f"{group}/{plural}: needs {needed}"


# ---- copies that must not drift -------------------------------------------------------------------


def test_crd_copy_matches_generated_crds() -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copy = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source, "no CRDs under crds/"
    assert copy == source, (
        "charts/moe-operator/crds/ drifted from crds/: cp crds/*.yaml charts/moe-operator/crds/"
    )


def test_alert_rules_copy_matches_policy() -> None:
    source = ROOT / "policies" / "prometheus" / "moe-alerts.rules.yaml"
    copy = CHART / "files" / "moe-alerts.rules.yaml"
    assert copy.read_bytes() == source.read_bytes(), f"{copy} drifted from {source}: copy it again"


def test_prometheus_rule_wraps_the_policy_groups() -> None:
    source = yaml.safe_load((ROOT / "policies" / "prometheus" / "moe-alerts.rules.yaml").read_text())
    rule = one(objects(template("monitoring.prometheusRule.enabled=true")), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == source["groups"]
    # Template braces of the annotations reach Prometheus untouched (not evaluated by Helm).
    assert "{{ $labels.deployment }}" in json.dumps(rule["spec"]["groups"])


# ---- monitoring -------------------------------------------------------------------------------------


def test_monitors_select_the_right_pods() -> None:
    docs = objects(template(*MONITORING_ON))
    dep = one(docs, "Deployment")
    operator_pm = one(docs, "PodMonitor", f"{dep['metadata']['name']}")
    assert operator_pm["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert operator_pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    engines = one(docs, "PodMonitor", f"{dep['metadata']['name']}-engines")
    assert engines["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "moe-operator",
        "app.kubernetes.io/name": "moe-engine",
    }
    endpoints = engines["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "runtime"]  # SGLang's /metrics and the sidecar's
    for endpoint in endpoints:
        relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert relabel["deployment"] == ["__meta_kubernetes_pod_label_moe_inference_dev_deployment"]
        assert relabel["pool"] == ["__meta_kubernetes_pod_label_moe_inference_dev_pool"]


def test_engine_pod_monitor_matches_rendered_engine_pods() -> None:
    """The example PodMonitor's selector, port and relabeling match what the operator renders."""
    from moe_contract.pod import SIDECAR_PORT
    from moe_operator.api import keys
    from moe_operator.render import labels

    assert SIDECAR_PORT == 9400
    source = (ROOT / "operator" / "moe_operator" / "render" / "group.py").read_text()
    assert '{"name": "runtime", "containerPort": SIDECAR_PORT}' in source
    assert labels.base_labels("x", "decode")["app.kubernetes.io/managed-by"] == keys.MANAGED_BY
    engines = one(objects(template("monitoring.enginePodMonitor.enabled=true")), "PodMonitor")
    assert engines["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": keys.MANAGED_BY,
        "app.kubernetes.io/name": labels.base_labels("x", "decode")["app.kubernetes.io/name"],
    }

    def meta(label: str) -> str:
        return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)

    relabel = {
        r["targetLabel"]: r["sourceLabels"] for r in engines["spec"]["podMetricsEndpoints"][0]["relabelings"]
    }
    assert relabel["deployment"] == [meta(keys.DEPLOYMENT)]
    assert relabel["pool"] == [meta(keys.POOL)]


def test_grafana_dashboard() -> None:
    cm = one(objects(template("monitoring.grafanaDashboard.enabled=true")), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["moe-operator.json"])
    panels = {p["title"]: p for p in dash["panels"]}
    heat = [p for p in dash["panels"] if p["type"] == "heatmap"]
    assert len(heat) == 1
    assert "moe_runtime_layer_balancedness" in heat[0]["targets"][0]["expr"]
    assert "by (layer)" in heat[0]["targets"][0]["expr"]
    assert "moe_runtime_balancedness" in panels["Pool balancedness"]["targets"][0]["expr"]
    assert "moe_runtime_placement_version" in panels["Placement version"]["targets"][0]["expr"]
    # Every series the dashboard queries is one the runtime sidecar exports.
    exported = set(re.findall(r'P \+ "(\w+)"', (ROOT / "runtime/moe_runtime/sidecar/metrics.py").read_text()))
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for metric in re.findall(r"moe_runtime_(\w+)\{", target["expr"]):
                assert metric in exported, f"panel {panel['title']!r} queries unknown moe_runtime_{metric}"


# ---- images -----------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "docker" / "versions.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_image_pins_agree() -> None:
    pins = versions()
    projects = {
        name: tomllib.loads((ROOT / name / "pyproject.toml").read_text())["project"]
        for name in ("placement", "contract", "runtime", "operator")
    }
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    versions_seen = {p["version"] for p in projects.values()}
    assert versions_seen == {pins["MOE_OPERATOR_VERSION"]} == {chart["appVersion"]}
    runtime = projects["runtime"]
    sglang_pin = next(d for d in runtime["optional-dependencies"]["engine"] if d.startswith("sglang=="))
    assert pins["SGLANG_IMAGE"].endswith(":v" + sglang_pin.removeprefix("sglang=="))
    assert pins["PYTHON_IMAGE"].startswith("python:3.11")
    for dockerfile, keys in [
        ("operator.Dockerfile", ("PYTHON_IMAGE", "MOE_OPERATOR_VERSION")),
        ("runtime.Dockerfile", ("SGLANG_IMAGE", "MOE_OPERATOR_VERSION")),
    ]:
        text = (ROOT / "docker" / dockerfile).read_text()
        for key in keys:
            assert f"ARG {key}={pins[key]}" in text, (
                f"{dockerfile}: ARG {key} default differs from versions.env"
            )
    operator = (ROOT / "docker" / "operator.Dockerfile").read_text()
    assert 'ENTRYPOINT ["moe-operator", "run"]' in operator
    assert re.search(r"^USER 10001", operator, re.M)
    runtime = (ROOT / "docker" / "runtime.Dockerfile").read_text()
    assert "pip install --no-cache-dir --no-deps --target /opt/moe-runtime ." in runtime
    assert "sglang.srt.plugins" in runtime


# ---- install into the sandbox ---------------------------------------------------------------------


def sa_kubeconfig(box: Sandbox, api: httpx.Client, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig with a token the API server issued to the chart's ServiceAccount (TokenRequest)."""
    resp = api.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert resp.status_code == 201, resp.text
    token = resp.json()["status"]["token"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sandbox",
                "cluster": {"server": box.server, "certificate-authority": str(box.pki.ca_cert)},
            }
        ],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sandbox", "user": sa, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    review = api.post(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
    ).json()
    assert review["status"]["user"]["username"] == f"system:serviceaccount:{namespace}:{sa}"
    return path


def operator_port_base() -> int:
    return int(os.environ.get("MOE_TEST_OPERATOR_PORT_BASE", "19000"))


def shared_operator_live() -> bool:
    """Whether the session's `moe_operator` (tests/operator_harness.py ports) is running now."""
    try:
        return (
            httpx.get(f"http://127.0.0.1:{operator_port_base() + 80}/healthz", timeout=1).status_code == 200
        )
    except httpx.HTTPError:
        return False


@pytest.fixture()
def shared_operator_paused(request: pytest.FixtureRequest, api: httpx.Client) -> Iterator[None]:
    """Stop the session's operator, if an earlier test started it, while this test runs its own
    (only the ServiceAccount-authenticated operator may act); give it back afterwards. One that
    is not running is not started: later tests may rely on there being no webhook yet."""
    running: Any = request.getfixturevalue("moe_operator") if shared_operator_live() else None
    if running is not None:
        running.stop()
    yield
    api.delete(WEBHOOK_CONFIG)
    if running is not None:
        running.start()


@pytest.mark.cluster
def test_helm_install_and_operator_runs_with_chart_rbac(
    sandbox: Sandbox, api: httpx.Client, namespace: str, tmp_path: Path, shared_operator_paused: None
) -> None:
    release = f"moe-{uuid.uuid4().hex[:6]}"
    kube = ["--kubeconfig", str(sandbox.kubeconfig), "--namespace", namespace]
    # No monitoring.coreos.com CRDs in the sandbox: monitoring stays off (the default).
    helm("install", release, str(CHART), *kube)
    try:
        fullname = f"{release}-moe-operator"
        crd = api.get(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/moedeployments.moe.inference.dev"
        )
        assert crd.status_code == 200
        for path in (
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{fullname}",
            f"/api/v1/namespaces/{namespace}/services/{fullname}-webhook",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{fullname}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{fullname}",
        ):
            assert api.get(path).status_code == 200, path

        # The operator pod is scheduled and "runs" (kwok: no process) under the chart's ServiceAccount.
        def operator_pod() -> dict[str, Any] | None:
            items = api.get(
                f"/api/v1/namespaces/{namespace}/pods",
                params={"labelSelector": f"app.kubernetes.io/instance={release}"},
            ).json()["items"]
            running = [p for p in items if p["status"].get("phase") == "Running"]
            return running[0] if running else None

        pod = wait_for(operator_pod, 60, what="operator pod Running")
        assert pod["spec"]["serviceAccountName"] == fullname
        assert release in helm("list", *kube).stdout

        # The real operator, authenticated as that ServiceAccount, reconciles an example to Ready.
        run_operator_as_service_account(sandbox, api, namespace, fullname, tmp_path)
    finally:
        helm("uninstall", release, *kube, "--wait", "--timeout", "60s")
    assert (
        api.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release}-moe-operator").status_code == 404
    )


def run_operator_as_service_account(
    box: Sandbox, api: httpx.Client, namespace: str, sa: str, tmp: Path
) -> None:
    from operator_harness import bind_model_volume

    user = f"system:serviceaccount:{namespace}:{sa}"
    kubeconfig = sa_kubeconfig(box, api, namespace, sa, tmp / "kubeconfig-sa")
    base = operator_port_base() + 200
    liveness, metrics, webhook = base + 80, base + 100, base + 443
    log_path = tmp / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "moe_operator.cli", "run",
                "--liveness", f"http://127.0.0.1:{liveness}/healthz",
                "--metrics-port", str(metrics),
                "--webhook-port", str(webhook),
                "--runtime-image", "moe-runtime:test",
            ],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])

    name = ""
    try:

        def live() -> bool:
            assert proc.poll() is None, tail()
            try:
                return httpx.get(f"http://127.0.0.1:{liveness}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(live, 60, what="operator liveness")

        def webhook_registered() -> bool:
            r = api.get(WEBHOOK_CONFIG)
            return r.status_code == 200 and any(
                str(webhook) in w["clientConfig"].get("url", "") for w in r.json().get("webhooks", [])
            )

        wait_for(webhook_registered, 60, what="validating webhook registered by the ServiceAccount")

        bind_model_volume(api, namespace, "qwen3-30b-a3b")
        obj = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
        name = obj["metadata"]["name"]
        resp = api.post(f"{MOED}/namespaces/{namespace}/moedeployments", json=obj)
        assert resp.status_code == 201, resp.text

        def ready() -> dict[str, Any] | None:
            assert proc.poll() is None, tail()
            got: dict[str, Any] = api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").json()
            conds = got.get("status", {}).get("conditions", [])
            return got if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None

        try:
            wait_for(ready, 120, interval=0.5, what=f"{name} Ready")
        except AssertionError:
            got = api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").json()
            raise AssertionError(f"not Ready: {json.dumps(got.get('status'))}\n{tail()}") from None

        # The webhook the ServiceAccount registered answers: an invalid spec is refused.
        bad = {
            **obj,
            "metadata": {"name": "bad"},
            "spec": {**obj["spec"], "eplb": {"mode": "operator", "redundantExperts": 3}},
        }
        refused = api.post(f"{MOED}/namespaces/{namespace}/moedeployments", json=bad)
        assert refused.status_code in (400, 422) and "denied the request" in refused.text, refused.text

        # Everything was done as the ServiceAccount, and nothing it tried was forbidden.
        audit = [json.loads(line) for line in box.audit_log.read_text().splitlines()]
        mine = [e for e in audit if e.get("stage") == "ResponseComplete" and e["user"]["username"] == user]
        forbidden = [e["requestURI"] for e in mine if e.get("responseStatus", {}).get("code") == 403]
        assert not forbidden, forbidden
        written = {(e["objectRef"]["resource"], e["verb"]) for e in mine if e["responseStatus"]["code"] < 300}
        for resource in (
            "statefulsets",
            "services",
            "configmaps",
            "roles",
            "rolebindings",
            "validatingwebhookconfigurations",
        ):
            assert any(r == resource for r, _ in written), (
                f"no write to {resource} by {user}: {sorted(written)}"
            )
        log_text = log_path.read_text(errors="replace")
        assert "Forbidden" not in log_text and " 403" not in log_text, tail()

        # Delete while the operator still runs (it owns the finalizer).
        api.delete(f"{MOED}/namespaces/{namespace}/moedeployments/{name}")
        wait_for(
            lambda: api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").status_code == 404,
            60,
            what=f"{name} deleted",
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
