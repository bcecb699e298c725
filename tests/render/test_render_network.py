"""The engine pods' ports, kubelet probes and NetworkPolicy (render/group.py, render/network.py).

The NetworkPolicy is judged by what it admits: a small evaluator of NetworkPolicy ingress semantics
(a selected pod drops every connection no rule allows; a peer with a namespaceSelector and a
podSelector needs both; a peer with a podSelector alone means the policy's namespace; no ports:
every port) asks, for peers the operator meets in a cluster, which ports of an engine pod they
reach. The apiserver's own validation of the object is in tests/security/test_network_policy.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from moe_contract import pod as P
from moe_operator.cli import run as run_cli
from moe_operator.recipe import startup_timeout_s
from moe_operator.render.group import RuntimeSettings
from moe_operator.render.network import (
    NetworkSettings,
    Peer,
    SelectorError,
    from_args,
    parse_selector,
)
from render_cases import EXAMPLES, REPO, example_children, example_spec

NCCL_PORT = 45123  # a port NCCL or the KV transfer engine picks at run time: in no pod spec


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = ()  # type: ignore[assignment]

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **dict(self.namespace_labels or {})}


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    assert set(selector or {}) <= {"matchLabels"}, f"evaluator knows matchLabels only: {selector}"
    return dict((selector or {}).get("matchLabels", {})).items() <= dict(labels).items()


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, source: Pod) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, peer
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], source.ns_labels()):
            return False
    elif source.namespace != policy_ns:
        return False
    return "podSelector" not in peer or _matches(peer["podSelector"], source.labels)


def admits(policies: list[dict[str, Any]], target: Pod, source: Pod, port: int) -> bool:
    """Whether ``source`` may open a TCP connection to ``port`` of ``target``."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and _matches(p["spec"]["podSelector"], target.labels)
        and "Ingress" in p["spec"]["policyTypes"]
    ]
    if not selecting:
        return True  # a pod no policy selects admits everything
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(
                p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in ports
            ):
                continue
            peers = rule.get("from")
            if peers is None or any(_peer_matches(f, policy["metadata"]["namespace"], source) for f in peers):
                return True
    return False


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            out.append((obj["metadata"]["namespace"], obj["spec"]["template"]))
        elif obj["kind"] == "LeaderWorkerSet":
            out.append((obj["metadata"]["namespace"], obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]))
    return out


def engine_container(template: dict[str, Any]) -> dict[str, Any]:
    (engine,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
    return engine


OPERATOR = Pod(
    "moe-system", {"app.kubernetes.io/name": "moe-operator", "app.kubernetes.io/component": "operator"}
)
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"})


# ---- ports and probes -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["StatefulSet", "LeaderWorkerSet"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_engine_ports_are_the_contracts_and_probes_use_the_probe_listener(example: str, backend: str) -> None:
    spec = example_spec(example)
    engines = [
        t
        for _ns, t in pod_templates(example_children(example, backend=backend))
        if "moe.inference.dev/pool" in t["metadata"]["labels"]
    ]
    assert engines
    for template in engines:
        engine = engine_container(template)
        ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
        assert ports[P.SIDECAR_PORT_NAME] == P.SIDECAR_PORT == 9400
        assert ports[P.PROBE_PORT_NAME] == P.PROBE_PORT == 9401
        assert ports[P.METRICS_PORT_NAME] == P.METRICS_PORT == 9402
        assert ports["http"] == spec.engine.port
        assert len(set(ports.values())) == len(ports), "one port per name"
        for kind, path in (
            ("startupProbe", P.LIVENESS_PATH),
            ("livenessProbe", P.LIVENESS_PATH),
            ("readinessProbe", P.READINESS_PATH),
        ):
            probe = engine[kind]
            # never the API port: its every route needs the token, the kubelet has none
            assert probe["httpGet"] == {"path": path, "port": P.PROBE_PORT_NAME}, kind
            assert probe["timeoutSeconds"] >= 2 and probe["periodSeconds"] >= probe["timeoutSeconds"], kind
            assert probe["failureThreshold"] >= 2, kind
        # the start-up budget is spec.engine.startupTimeout, in probe periods (unset: 60m for the
        # multi-node FP8 block-quantised examples, which compile DeepGEMM kernels on a cold start)
        startup = engine["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] == startup_timeout_s(spec)
        # a hung runtime restarts the group after a minute of failed liveness probes, not sooner
        live = engine["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] >= 60


# ---- the NetworkPolicy ----------------------------------------------------------------------------


def engine_pods(objects: list[dict[str, Any]]) -> list[Pod]:
    return [
        Pod(ns, t["metadata"]["labels"])
        for ns, t in pod_templates(objects)
        if "moe.inference.dev/pool" in t["metadata"]["labels"]
    ]


def router_pods(objects: list[dict[str, Any]]) -> list[Pod]:
    return [
        Pod(ns, t["metadata"]["labels"])
        for ns, t in pod_templates(objects)
        if t["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    ]


def policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_who_reaches_which_port_of_an_engine_pod(example: str) -> None:
    spec = example_spec(example)
    objects = example_children(example)
    (policy,) = policies(objects)
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "MoEDeployment"
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress is left alone"
    http, api, metrics, probes = spec.engine.port, P.SIDECAR_PORT, P.METRICS_PORT, P.PROBE_PORT
    every = {
        http,
        api,
        metrics,
        probes,
        spec.engine.dist_init_port,
        spec.kv_transfer.bootstrap_port,
        NCCL_PORT,
    }
    engines, routers = engine_pods(objects), router_pods(objects)
    assert engines and routers
    other_deployment = Pod("inference", {**engines[0].labels, "moe.inference.dev/deployment": "other"})
    other_router = Pod("inference", {**routers[0].labels, "moe.inference.dev/deployment": "other"})
    tenant_pod = Pod("inference", {"app": "notebook"})
    operator_lookalike = Pod("inference", OPERATOR.labels)  # the operator's labels, the tenant's namespace
    prometheus_lookalike = Pod("inference", PROMETHEUS.labels)
    other_in_operator_ns = Pod("moe-system", {"app": "something-else"})
    expected: list[tuple[str, Pod, set[int]]] = [
        ("operator", OPERATOR, {api}),
        ("prometheus", PROMETHEUS, {metrics, http}),
        ("router of this deployment", routers[0], {http}),
        ("router of another deployment", other_router, set()),
        ("engine of another deployment", other_deployment, set()),
        ("any other pod of the namespace", tenant_pod, set()),
        ("a pod with the operator's labels elsewhere", operator_lookalike, set()),
        ("a pod with Prometheus' labels elsewhere", prometheus_lookalike, set()),
        ("another pod of the operator's namespace", other_in_operator_ns, set()),
    ]
    expected += [(f"engine {i} of this deployment", e, every) for i, e in enumerate(engines)]
    for target in engines:
        for who, source, ports in expected:
            reached = {p for p in every if admits(policies(objects), target, source, p)}
            assert reached == ports, (
                f"{example}: {who} -> {target.labels['moe.inference.dev/pool']}: {sorted(reached)}"
            )
    # the router pods are not selected (their own ports stay as they were)
    for router in routers:
        assert admits(policies(objects), router, tenant_pod, spec.router.port)


def test_pools_reach_each_other_in_prefill_decode() -> None:
    """P/D: decode pulls KV from prefill (bootstrap port, then the transfer engine's own ports)."""
    objects = example_children("deepseek-v3-pd-h100.yaml")
    prefill = [p for p in engine_pods(objects) if p.labels["moe.inference.dev/pool"] == "prefill"]
    decode = [p for p in engine_pods(objects) if p.labels["moe.inference.dev/pool"] == "decode"]
    assert prefill and decode
    bootstrap = example_spec("deepseek-v3-pd-h100.yaml").kv_transfer.bootstrap_port
    for port in (bootstrap, NCCL_PORT):
        assert admits(policies(objects), prefill[0], decode[0], port)
        assert admits(policies(objects), decode[0], prefill[0], port)


def test_policy_ports_are_ports_the_engine_serves() -> None:
    objects = example_children("deepseek-v3-gb200.yaml")
    (policy,) = policies(objects)
    served = {
        p["containerPort"]
        for _ns, t in pod_templates(objects)
        if "moe.inference.dev/pool" in t["metadata"]["labels"]
        for p in engine_container(t)["ports"]
    }
    named = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
    assert named and named <= served
    assert P.PROBE_PORT not in named, "the kubelet's probes come from the node: always admitted"


def test_platform_settings_choose_the_peers() -> None:
    net = NetworkSettings(
        operator=Peer({"kubernetes.io/metadata.name": "ops"}, {"app": "op"}),
        prometheus=Peer({}, {"app.kubernetes.io/name": "prometheus"}),  # any namespace
    )
    objects = example_children("qwen3-30b-a3b-single-node.yaml", RuntimeSettings(network=net))
    (target, *_) = engine_pods(objects)
    pols = policies(objects)
    assert admits(pols, target, Pod("ops", {"app": "op"}), P.SIDECAR_PORT)
    assert not admits(pols, target, OPERATOR, P.SIDECAR_PORT), "the default operator peer is gone"
    assert admits(
        pols, target, Pod("team-a-monitoring", {"app.kubernetes.io/name": "prometheus"}), P.METRICS_PORT
    )


def test_opt_out_renders_no_policy() -> None:
    objects = example_children(
        "qwen3-30b-a3b-single-node.yaml", RuntimeSettings(network=NetworkSettings(enabled=False))
    )
    assert not policies(objects)
    assert example_children("qwen3-30b-a3b-single-node.yaml")[-1]["kind"] == "NetworkPolicy"


# ---- flags and chart values -----------------------------------------------------------------------


def run_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["run", *argv])


def test_flags_defaults_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert from_args(run_args()) == NetworkSettings()
    net = from_args(
        run_args(
            "--no-network-policy",
            "--operator-namespace=ops",
            "--operator-pod-selector=app=op, tier=control",
            "--prometheus-namespace-selector=",
            "--prometheus-pod-selector=app.kubernetes.io/name=prometheus",
        )
    )
    assert not net.enabled
    assert net.operator == Peer({"kubernetes.io/metadata.name": "ops"}, {"app": "op", "tier": "control"})
    assert net.prometheus == Peer({}, {"app.kubernetes.io/name": "prometheus"})
    assert net.prometheus.selector() == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--operator-pod-selector="], "--operator-pod-selector: empty"),
        (["--operator-pod-selector=app"], "--operator-pod-selector: 'app' is not key=value"),
        (
            ["--prometheus-pod-selector=app=a b"],
            "--prometheus-pod-selector: 'a b' (of app) is not a label value",
        ),
        (["--prometheus-namespace-selector=-x=y"], "--prometheus-namespace-selector: '-x=y'"),
        (["--operator-namespace=Bad_NS!"], "--operator-namespace: 'Bad_NS!'"),
        (["--prometheus-pod-selector=a=1,a=2"], "a given twice"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SelectorError) as exc:
        from_args(run_args(*argv))
    assert message in str(exc.value)


def test_parse_selector() -> None:
    assert parse_selector("", "--f") == {}
    assert parse_selector("a=b, example.com/x=y,", "--f") == {"a": "b", "example.com/x": "y"}
    assert parse_selector("a=", "--f") == {"a": ""}


def _helm_template(*sets: str) -> list[dict[str, Any]]:
    from moe_sandbox.toolchain import binary_path

    exe = binary_path("helm")
    assert exe.exists(), f"{exe} missing: build it with `moe-sandbox build` (e2e/setup.sh does)"
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/moe-helm/cache", "HELM_CONFIG_HOME": "/tmp/moe-helm/config"}
    args = [str(exe), "template", "moe", str(REPO / "charts" / "moe-operator"), "--namespace", "ops"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return dep


def test_chart_values_reach_the_operator_flags() -> None:
    """The chart's args, parsed by the operator's own parser: the operator peer is exactly the chart's
    operator pods (release namespace and pod template labels), Prometheus' the values."""
    dep = _operator_deployment(_helm_template())
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    net = from_args(run_args(*container["args"]))
    assert net.enabled
    assert net.operator.namespaces == {"kubernetes.io/metadata.name": "ops"}
    assert dict(net.operator.pods).items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert net.operator.pods == dep["spec"]["selector"]["matchLabels"]
    assert net.prometheus == Peer(
        {"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "prometheus"}
    )

    dep = _operator_deployment(
        _helm_template(
            "networkPolicy.enabled=false",
        )
    )
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert not from_args(run_args(*container["args"])).enabled
    dep = _operator_deployment(
        _helm_template(
            "networkPolicy.prometheus.namespaceSelector=null",
            "networkPolicy.prometheus.podSelector.app=prom",
        )
    )
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    prom = from_args(run_args(*container["args"])).prometheus
    assert prom == Peer({}, {"app.kubernetes.io/name": "prometheus", "app": "prom"})


def test_chart_schema_refuses_bad_selectors() -> None:
    from moe_sandbox.toolchain import binary_path

    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/moe-helm/cache", "HELM_CONFIG_HOME": "/tmp/moe-helm/config"}
    args = [str(binary_path("helm")), "template", "moe", str(REPO / "charts" / "moe-operator")]
    proc = subprocess.run(
        [*args, "--set", "networkPolicy.prometheus.podSelector.app=a b"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "/networkPolicy/prometheus/podSelector/app" in proc.stderr
