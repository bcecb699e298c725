"""The Helm chart (charts/moe-operator): lint, golden renders, schema, RBAC, copies that must not drift,
and an install into the sandbox whose ServiceAccount is shown sufficient by running the real operator
with the ServiceAccount's own token."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from moe_sandbox.toolchain import binary_path
from sa_operator import WEBHOOK_CONFIG, ServiceAccountOperator, shared_operator_paused  # noqa: F401

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
    docs = objects(template())
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    assert not [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]
    assert {"ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"} <= kinds


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
    # Leader election through the chart's peering object; one replica need not find it.
    assert args["peering"] == f"{RELEASE}-moe-operator"
    assert "--peering-required" not in c["args"]
    assert "affinity" not in spec["template"]["spec"]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    # The generated webhook certificate is shared through a Secret in the pod's own namespace.
    assert args["webhook-cert-secret"] == f"{RELEASE}-moe-operator-webhook-certs"
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in c[
        "env"
    ]
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
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert not any("admissionregistration.k8s.io" in r["apiGroups"] for r in rules)
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")], "no certificate Secret to keep"

    docs = objects(template("webhook.certSecret=moe-webhook-tls"))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--webhook-cert=/etc/moe-operator/webhook-tls/tls.crt" in c["args"]
    assert "--webhook-ca=/etc/moe-operator/webhook-tls/ca.crt" in c["args"]
    assert not any(a.startswith("--webhook-cert-secret") for a in c["args"])
    assert {"name": "webhook-tls", "secret": {"secretName": "moe-webhook-tls"}} in pod["volumes"]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")], "the mounted Secret is not written"


@pytest.mark.parametrize("sets", [[], ["operator.watchNamespaces={team-a,team-b}"]])
def test_two_replicas_elect_one_through_the_chart_peering(sets: list[str]) -> None:
    docs = objects(template("replicaCount=2", *sets))
    dep = one(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    # A rollout starts the new pod before it stops an old one: one replica is always there.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (c,) = spec["template"]["spec"]["containers"]
    name = f"{RELEASE}-moe-operator"
    assert f"--peering={name}" in c["args"] and "--peering-required" in c["args"]
    peerings = [d for d in docs if d["apiVersion"] == "kopf.dev/v1"]
    if sets:  # one KopfPeering per watched namespace, as kopf uses with --namespace
        assert sorted((d["kind"], d["metadata"]["namespace"]) for d in peerings) == [
            ("KopfPeering", "team-a"),
            ("KopfPeering", "team-b"),
        ]
    else:
        assert [(d["kind"], d["metadata"].get("namespace")) for d in peerings] == [
            ("ClusterKopfPeering", None)
        ]
    assert {d["metadata"]["name"] for d in peerings} == {name}
    selector = spec["selector"]["matchLabels"]
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    # The peering CRDs ship with the chart (installed before the peering objects).
    crds = {
        d["metadata"]["name"]
        for d in yaml.safe_load_all((CHART / "crds" / "kopf.dev-peerings.yaml").read_text())
    }
    assert crds == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


@pytest.mark.parametrize("count", ["0", "3"])
def test_schema_allows_one_or_two_replicas(count: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "--set", f"replicaCount={count}", check=False)
    assert proc.returncode != 0 and "/replicaCount" in proc.stderr, proc.stderr


# ---- RBAC ---------------------------------------------------------------------------------------

# (apiGroup, resource, resourceName or "") -> verbs. Cluster-scoped objects, always a ClusterRole:
EXPECTED_CLUSTER_RULES: dict[tuple[str, str, str], set[str]] = {
    ("", "nodes", ""): {"get", "list", "watch"},
    ("apiextensions.k8s.io", "customresourcedefinitions", ""): {"get", "list", "watch"},
    # kopf creates the webhook configurations if absent (create cannot be limited by name) and then
    # patches only its own.
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", ""): {"create"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ""): {"create"},
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "moe.inference.dev"): {"patch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "moe.inference.dev"): {"patch"},
}
# Leader election through kopf peering: cluster-wide, or in each watched namespace.
CLUSTER_PEERING: dict[tuple[str, str, str], set[str]] = {
    ("kopf.dev", "clusterkopfpeerings", ""): {"list", "watch"},
    ("kopf.dev", "clusterkopfpeerings", f"{RELEASE}-moe-operator"): {"get", "patch"},
}
NAMESPACED_PEERING: dict[tuple[str, str, str], set[str]] = {
    ("kopf.dev", "kopfpeerings", ""): {"list", "watch"},
    ("kopf.dev", "kopfpeerings", f"{RELEASE}-moe-operator"): {"get", "patch"},
}
# In the release namespace: the Secret holding the generated webhook certificate every replica
# serves (create cannot be limited by name in Kubernetes RBAC).
WEBHOOK_CERT_RULES: dict[tuple[str, str, str], set[str]] = {
    ("", "secrets", f"{RELEASE}-moe-operator-webhook-certs"): {"get", "update"},
    ("", "secrets", ""): {"create"},
}
# Inside each watched namespace (a ClusterRole without operator.watchNamespaces, else a Role in each).
EXPECTED_NAMESPACED_RULES: dict[tuple[str, str, str], set[str]] = {
    ("moe.inference.dev", "moedeployments", ""): {"get", "list", "watch", "patch"},
    ("moe.inference.dev", "moedeployments/status", ""): {"patch"},
    ("", "pods", ""): {"get", "list", "watch", "delete", "deletecollection"},
    **{
        (g, r, ""): {"get", "list", "watch", "create", "patch", "delete"}
        for g, r in [
            ("", "services"),
            ("", "configmaps"),
            ("", "serviceaccounts"),
            ("apps", "statefulsets"),
            ("apps", "deployments"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("policy", "poddisruptionbudgets"),
            ("networking.k8s.io", "networkpolicies"),
            ("monitoring.coreos.com", "podmonitors"),
            ("monitoring.coreos.com", "prometheusrules"),
            ("resource.nvidia.com", "computedomains"),
        ]
    },
    ("", "secrets", ""): {"get", "create"},  # the runtime token only: never listed or watched
    ("", "events", ""): {"create"},
}
CLUSTER_SCOPED = {
    "nodes",
    "customresourcedefinitions",
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate"}


def granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str, str], set[str]]:
    out: dict[tuple[str, str, str], set[str]] = {}
    for rule in rules:
        assert "nonResourceURLs" not in rule, rule
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert not any("*" in v for v in rule.get(field, [])), f"wildcard in {field}: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    out.setdefault((group, resource, name), set()).update(rule["verbs"])
    return out


def bound_to_the_service_account(
    docs: list[dict[str, Any]], binding: dict[str, Any], role: dict[str, Any]
) -> None:
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": role["kind"],
        "name": role["metadata"]["name"],
    }
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_rbac_is_least_privilege_without_wildcards() -> None:
    docs = objects(template())
    cluster = one(docs, "ClusterRole", f"{RELEASE}-moe-operator")
    namespaced = one(docs, "ClusterRole", f"{RELEASE}-moe-operator-namespaced")
    assert granted(cluster["rules"]) == EXPECTED_CLUSTER_RULES | CLUSTER_PEERING
    assert granted(namespaced["rules"]) == EXPECTED_NAMESPACED_RULES
    for role in (cluster, namespaced):
        bound_to_the_service_account(docs, one(docs, "ClusterRoleBinding", role["metadata"]["name"]), role)
    certs = one(docs, "Role")
    assert certs["metadata"] == {
        **certs["metadata"],
        "name": f"{RELEASE}-moe-operator-webhook-certs",
        "namespace": NAMESPACE,
    }
    assert granted(certs["rules"]) == WEBHOOK_CERT_RULES
    bound_to_the_service_account(docs, one(docs, "RoleBinding"), certs)


def test_watch_namespaces_get_roles_and_only_cluster_scoped_rights_cluster_wide() -> None:
    docs = objects(template("operator.watchNamespaces={team-a,team-b}"))
    (cluster,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert granted(cluster["rules"]) == EXPECTED_CLUSTER_RULES
    assert {r for _g, r, _n in granted(cluster["rules"])} <= CLUSTER_SCOPED
    bound_to_the_service_account(docs, one(docs, "ClusterRoleBinding"), cluster)
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == f"{RELEASE}-moe-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    certs = one(docs, "Role", f"{RELEASE}-moe-operator-webhook-certs")
    assert certs["metadata"]["namespace"] == NAMESPACE and granted(certs["rules"]) == WEBHOOK_CERT_RULES
    for role in roles:
        assert granted(role["rules"]) == EXPECTED_NAMESPACED_RULES | NAMESPACED_PEERING
        binding = one(
            [d for d in docs if d["metadata"].get("namespace") == role["metadata"]["namespace"]],
            "RoleBinding",
            role["metadata"]["name"],
        )
        bound_to_the_service_account(docs, binding, role)
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [a for a in c["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]


def test_rbac_writes_no_rbac_and_reads_secrets_only_by_get() -> None:
    for sets in ([], ["operator.watchNamespaces={team-a}"]):
        rules: dict[tuple[str, str, str], set[str]] = {}
        for d in objects(template(*sets)):
            if d["kind"] in ("ClusterRole", "Role"):
                for key, verbs in granted(d["rules"]).items():
                    rules.setdefault(key, set()).update(verbs)
        rbac = {k: v for k, v in rules.items() if k[0] == "rbac.authorization.k8s.io"}
        assert all(not v & WRITE_VERBS for v in rbac.values()), rbac
        # Secrets are never listed or watched; update only on the webhook certificate Secret by name.
        secrets = {k: v for k, v in rules.items() if k[1] == "secrets"}
        assert secrets == {
            ("", "secrets", ""): {"get", "create"},
            ("", "secrets", f"{RELEASE}-moe-operator-webhook-certs"): {"get", "update"},
        }, secrets


def test_schema_refuses_duplicate_watch_namespaces() -> None:
    proc = helm("template", RELEASE, str(CHART), "--set", "operator.watchNamespaces={a,a}", check=False)
    assert proc.returncode != 0 and "watchNamespaces" in proc.stderr, proc.stderr


def test_rbac_covers_every_kind_the_operator_writes() -> None:
    """Every child kind the renderer produces (every example, both group backends, monitoring on) is
    granted what server-side apply, pruning and the child indexes need; plus the token Secret, the
    pods a group restart deletes and the MoEDeployment's own status."""
    import uuid as _uuid

    from moe_operator.api import MoEDeploymentSpec
    from moe_operator.render.children import render_children
    from moe_operator.render.group import Owner, RuntimeSettings
    from moe_operator.topology.planner import InstanceSite, TopologyPlan

    rules = granted(one(objects(template()), "ClusterRole", f"{RELEASE}-moe-operator-namespaced")["rules"])
    kinds: set[tuple[str, str]] = set()
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        spec = MoEDeploymentSpec.model_validate(yaml.safe_load(example.read_text())["spec"])
        plan = TopologyPlan(
            sites=(InstanceSite("decode", 0, "node", "kubernetes.io/hostname", "n", ("n",)),), waiting=()
        )
        owner = Owner("x", "ns", str(_uuid.uuid4()))
        for backend in ("StatefulSet", "LeaderWorkerSet"):
            for obj in render_children(
                spec, owner, plan, RuntimeSettings(), None, backend, ("PodMonitor", "PrometheusRule")
            ):  # type: ignore[arg-type]
                kinds.add((obj["apiVersion"].rpartition("/")[0], obj["kind"]))
    assert {k for _g, k in kinds} >= {
        "StatefulSet",
        "LeaderWorkerSet",
        "Deployment",
        "ServiceAccount",
        "PodMonitor",
        "NetworkPolicy",
    }
    plural = {
        "ConfigMap": "configmaps",
        "Service": "services",
        "ServiceAccount": "serviceaccounts",
        "StatefulSet": "statefulsets",
        "Deployment": "deployments",
        "LeaderWorkerSet": "leaderworkersets",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "NetworkPolicy": "networkpolicies",
        "PodMonitor": "podmonitors",
        "PrometheusRule": "prometheusrules",
    }
    for group, kind in sorted(kinds):
        needed = {"get", "list", "watch", "create", "patch", "delete"}
        assert needed <= rules.get((group, plural[kind], ""), set()), f"{group}/{kind}: needs {needed}"
    assert {"get", "create"} <= rules[("", "secrets", "")]
    assert {"get", "delete", "deletecollection"} <= rules[("", "pods", "")]
    assert {"get", "patch"} <= rules[("moe.inference.dev", "moedeployments", "")]
    assert {"patch"} <= rules[("moe.inference.dev", "moedeployments/status", "")]


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
    assert [e["port"] for e in endpoints] == ["http", "metrics"]  # SGLang's /metrics and the runtime's
    for endpoint in endpoints:
        relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert relabel["deployment"] == ["__meta_kubernetes_pod_label_moe_inference_dev_deployment"]
        assert relabel["pool"] == ["__meta_kubernetes_pod_label_moe_inference_dev_pool"]


def test_engine_pod_monitor_matches_rendered_engine_pods() -> None:
    """The example PodMonitor's selector, port and relabeling match what the operator renders."""
    from moe_contract.pod import METRICS_PORT, METRICS_PORT_NAME
    from moe_operator.api import keys
    from moe_operator.render import labels
    from moe_operator.render.engine_container import engine_ports
    from render_cases import gb200_decode_spec

    ports = {p["name"]: p["containerPort"] for p in engine_ports(gb200_decode_spec(), "decode")}
    assert ports[METRICS_PORT_NAME] == METRICS_PORT == 9402  # the chart names the port, 9402 in comments
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
    cm = one(
        objects(template("monitoring.grafanaDashboard.enabled=true")),
        "ConfigMap",
        f"{RELEASE}-moe-operator-dashboard",
    )
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


@pytest.mark.cluster
@pytest.mark.usefixtures("shared_operator_paused")
def test_helm_install_and_operator_runs_with_chart_rbac(
    sandbox: Sandbox, api: httpx.Client, namespace: str, tmp_path: Path
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
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{fullname}-namespaced",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{fullname}-namespaced",
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

    # As the chart runs it: elected through the chart's ClusterKopfPeering (required, as with two
    # replicas), the generated webhook certificate kept in the chart's Secret.
    certs = f"{sa}-webhook-certs"
    args = (
        "--peering",
        sa,
        "--peering-required",
        "--webhook-cert-secret",
        certs,
        "--webhook-cert-namespace",
        namespace,
    )
    with ServiceAccountOperator(box, api, namespace, sa, tmp, args) as op:

        def webhook_registered() -> bool:
            r = api.get(WEBHOOK_CONFIG)
            return r.status_code == 200 and any(
                str(op.webhook) in w["clientConfig"].get("url", "") for w in r.json().get("webhooks", [])
            )

        wait_for(webhook_registered, 60, what="validating webhook registered by the ServiceAccount")

        bind_model_volume(api, namespace, "qwen3-30b-a3b")
        obj = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
        name = obj["metadata"]["name"]
        resp = api.post(f"{MOED}/namespaces/{namespace}/moedeployments", json=obj)
        assert resp.status_code == 201, resp.text

        def ready() -> dict[str, Any] | None:
            op.assert_running()
            got: dict[str, Any] = api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").json()
            conds = got.get("status", {}).get("conditions", [])
            return got if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None

        try:
            wait_for(ready, 120, interval=0.5, what=f"{name} Ready")
        except AssertionError:
            got = api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").json()
            raise AssertionError(f"not Ready: {json.dumps(got.get('status'))}\n{op.tail()}") from None

        # The webhook the ServiceAccount registered answers: an invalid spec is refused.
        bad = {
            **obj,
            "metadata": {"name": "bad"},
            "spec": {**obj["spec"], "eplb": {"mode": "operator", "redundantExperts": 3}},
        }
        refused = api.post(f"{MOED}/namespaces/{namespace}/moedeployments", json=bad)
        assert refused.status_code in (400, 422) and "denied the request" in refused.text, refused.text

        # Everything was done as the ServiceAccount, and RBAC refused it nothing. (A 403 that RBAC
        # allowed is admission's: an earlier test's namespace still terminating, whose leftover
        # deployments this cluster-wide operator finalizes, refuses new Events.)
        mine = op.audit()
        forbidden = [
            e["requestURI"]
            for e in mine
            if e.get("annotations", {}).get("authorization.k8s.io/decision") != "allow"
            and e.get("responseStatus", {}).get("code") == 403
        ]
        assert not forbidden, forbidden
        written = {(e["objectRef"]["resource"], e["verb"]) for e in mine if e["responseStatus"]["code"] < 300}
        for resource in (
            "statefulsets",
            "services",
            "configmaps",
            "serviceaccounts",
            "validatingwebhookconfigurations",
            "clusterkopfpeerings",
        ):
            assert any(r == resource for r, _ in written), (
                f"no write to {resource} by {op.user}: {sorted(written)}"
            )
        assert any(
            e["objectRef"].get("name") == certs
            and e["verb"] == "create"
            and e["responseStatus"]["code"] == 201
            for e in mine
        ), "the webhook certificate Secret was not created by the ServiceAccount"
        peering = api.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{sa}").json()
        assert peering.get("status"), f"no replica recorded itself in the peering object: {peering}"
        refused = [
            line
            for line in op.log_path.read_text(errors="replace").splitlines()
            if ("Forbidden" in line or " 403" in line) and "is being terminated" not in line
        ]
        assert not refused, refused[:5]

        # Delete while the operator still runs (it owns the finalizer).
        api.delete(f"{MOED}/namespaces/{namespace}/moedeployments/{name}")
        wait_for(
            lambda: api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").status_code == 404,
            60,
            what=f"{name} deleted",
        )


def test_platform_hardware_profiles_reach_the_operator() -> None:
    """values hardwareProfiles -> a ConfigMap mounted into the operator, named by MOE_HARDWARE_PROFILES,
    in the shape the operator loads (moe_operator.hardware.load_profiles); a change restarts it."""
    import tempfile

    from moe_operator.hardware import load_profiles

    assert not [
        d for d in objects(template()) if d["kind"] == "ConfigMap" and "hardware" in d["metadata"]["name"]
    ]
    docs = objects(
        template(
            "hardwareProfiles[0].name=site-h200",
            "hardwareProfiles[0].description=ours",
            "hardwareProfiles[0].gpuProduct=NVIDIA-H200",
            "hardwareProfiles[0].gpusPerNode=8",
            "hardwareProfiles[0].gpuMemory=141Gi",
            "hardwareProfiles[0].nvlinkDomainSize=8",
            "hardwareProfiles[0].fabric=roce",
            "hardwareProfiles[0].batchPerRank=256",
            "hardwareProfiles[0].memFractionStatic.prefill=0.85",
            "hardwareProfiles[0].memFractionStatic.decode=0.81",
            "hardwareProfiles[0].memFractionStatic.standalone=0.81",
        )
    )
    config = one(docs, "ConfigMap", f"{RELEASE}-moe-operator-hardware-profiles")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as fh:
        fh.write(config["data"]["profiles.yaml"])
        fh.flush()
        assert load_profiles(fh.name)["site-h200"].fabric == "roce"
    pod = one(docs, "Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "hardware-profiles")
    assert env["MOE_HARDWARE_PROFILES"] == f"{mount['mountPath']}/profiles.yaml"
    assert "checksum/hardware-profiles" in pod["metadata"]["annotations"]
