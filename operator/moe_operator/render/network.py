"""The NetworkPolicy of one MoEDeployment's engine pods: the platform's choice, not the tenant's.

Once a NetworkPolicy selects a pod, every ingress it does not allow is dropped. So the policy
allows, on the engine pods of one deployment (docs/security.md, "Runtime API"):

- every port from the engine pods of the same deployment: NCCL and torch.distributed between the
  ranks of a group (dist-init and the ports NCCL picks), SGLang's own health/ready calls, and in
  P/D the KV transfer between the prefill and decode pools (bootstrap port and the transfer
  engine's ports);
- SGLang's HTTP port from the deployment's router pods (requests and worker health checks);
- the runtime API (bearer token) from the operator's pods (collector and placement pushes), and
  SGLang's HTTP port from them where a pool is autoscaled (the autoscaler reads its /metrics);
- the runtime's metrics listener and SGLang's HTTP port (its /metrics) from Prometheus.

The kubelet's probes are not affected: traffic from the pod's own node is always allowed. Pods on
the host network are not subject to NetworkPolicy at all. Peers are matched by labels (and the
operator's and Prometheus' namespaces), which are not identities: a pod of the same namespace
that copies the engine labels is admitted, and the token still guards the API.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moe_contract import pod as P
from moe_operator.api import keys as K
from moe_operator.render import labels as L

if TYPE_CHECKING:  # group.py holds these settings in RuntimeSettings
    from moe_operator.api import MoEDeploymentSpec
    from moe_operator.render.group import Owner

API_VERSION = "networking.k8s.io/v1"
COMPONENT = "network"
ENGINE_NAME = "moe-engine"  # labels.base_labels of the prefill/decode pods
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the apiserver on every namespace (to the namespace's name): selects one namespace."""

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")


class SelectorError(ValueError):
    """A label selector flag that is not ``key=value[,key=value...]`` of valid label keys and values."""


def parse_selector(text: str, flag: str) -> dict[str, str]:
    """``key=value,key2=value2`` as matchLabels; "" is the empty selector (everything)."""
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        prefix = key.rpartition("/")[0]
        if not sep or not _KEY.match(key) or len(prefix) > 253:
            raise SelectorError(f"{flag}: {item!r} is not key=value with a Kubernetes label key")
        if not _VALUE.match(value):
            raise SelectorError(
                f"{flag}: {value!r} (of {key}) is not a label value: at most 63 letters, digits, '-', '_' "
                "or '.', starting and ending with a letter or digit"
            )
        if key in out and out[key] != value:
            raise SelectorError(f"{flag}: {key} given twice with different values")
        out[key] = value
    return out


@dataclass(frozen=True)
class Peer:
    """Pods matched by ``pods`` in the namespaces matched by ``namespaces`` (matchLabels; empty:
    every pod / every namespace)."""

    namespaces: Mapping[str, str] = field(default_factory=dict)
    pods: Mapping[str, str] = field(default_factory=dict)

    def selector(self) -> dict[str, Any]:
        return {
            "namespaceSelector": {"matchLabels": dict(self.namespaces)} if self.namespaces else {},
            "podSelector": {"matchLabels": dict(self.pods)} if self.pods else {},
        }


DEFAULT_OPERATOR_POD_LABELS = {
    "app.kubernetes.io/name": "moe-operator",
    "app.kubernetes.io/component": "operator",
}
"""The chart's selector labels of the operator pods (its release name is not known here)."""
DEFAULT_PROMETHEUS = Peer({NAMESPACE_NAME_LABEL: "monitoring"}, {"app.kubernetes.io/name": "prometheus"})
"""kube-prometheus-stack's Prometheus pods in namespace ``monitoring``."""


@dataclass(frozen=True)
class NetworkSettings:
    """The operator's flags (``--network-policy`` ...): whether to render the policy and who the
    operator and Prometheus are."""

    enabled: bool = True
    operator: Peer = field(
        default_factory=lambda: Peer({NAMESPACE_NAME_LABEL: "moe-system"}, DEFAULT_OPERATOR_POD_LABELS)
    )
    prometheus: Peer = DEFAULT_PROMETHEUS


def policy_name(name: str) -> str:
    return f"{name}-engines"


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def engine_selector(name: str) -> dict[str, str]:
    """The engine pods (both pools) of one deployment."""
    return {K.DEPLOYMENT: name, "app.kubernetes.io/name": ENGINE_NAME}


def router_selector(name: str) -> dict[str, str]:
    return {K.DEPLOYMENT: name, "app.kubernetes.io/name": "moe-router"}


def operator_ports(spec: MoEDeploymentSpec) -> list[int]:
    """The runtime API; and SGLang's HTTP port (its /metrics) where the operator autoscales a pool."""
    scaled = any(
        p is not None and p.autoscaling is not None and p.autoscaling.mode == "Operator"
        for p in (spec.prefill, spec.decode)
    )
    return [P.SIDECAR_PORT, spec.engine.port] if scaled else [P.SIDECAR_PORT]


def network_policy(spec: MoEDeploymentSpec, owner: Owner, net: NetworkSettings) -> dict[str, Any]:
    """The deployment's engine pods' ingress allowlist (module docstring)."""
    http = spec.engine.port
    ingress: list[dict[str, Any]] = [
        # Ranks, pools and SGLang among themselves: every port (NCCL picks its own).
        {"from": [{"podSelector": {"matchLabels": engine_selector(owner.name)}}]},
        {"from": [{"podSelector": {"matchLabels": router_selector(owner.name)}}], "ports": _tcp(http)},
        {"from": [net.operator.selector()], "ports": _tcp(*operator_ports(spec))},
        {"from": [net.prometheus.selector()], "ports": _tcp(P.METRICS_PORT, http)},
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {
            "name": policy_name(owner.name),
            "namespace": owner.namespace,
            "labels": L.base_labels(owner.name, COMPONENT),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "podSelector": {"matchLabels": engine_selector(owner.name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def network_objects(spec: MoEDeploymentSpec, owner: Owner, net: NetworkSettings) -> list[dict[str, Any]]:
    """The policy, or nothing where the platform turned it off (the reconciler then prunes it)."""
    return [network_policy(spec, owner, net)] if net.enabled else []


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``moe-operator run``'s flags (chart values networkPolicy.*)."""
    parser.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="render a NetworkPolicy per MoEDeployment admitting the runtime API only from the operator and "
        "the metrics only from Prometheus (--no-network-policy: none, and those rendered earlier are pruned)",
    )
    parser.add_argument(
        "--operator-namespace",
        default=os.environ.get("POD_NAMESPACE", "moe-system"),
        help="namespace of the operator's pods, admitted to the runtime API (default: $POD_NAMESPACE, "
        "else moe-system)",
    )
    parser.add_argument(
        "--operator-pod-selector",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_OPERATOR_POD_LABELS.items()),
        metavar="K=V,...",
        help="labels of the operator's pods in --operator-namespace (default: the chart's selector labels "
        "without the release)",
    )
    parser.add_argument(
        "--prometheus-namespace-selector",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_PROMETHEUS.namespaces.items()),
        metavar="K=V,...",
        help="labels of the namespaces Prometheus runs in (empty: every namespace; default: the namespace "
        "named monitoring)",
    )
    parser.add_argument(
        "--prometheus-pod-selector",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_PROMETHEUS.pods.items()),
        metavar="K=V,...",
        help="labels of the Prometheus pods there (empty: every pod of those namespaces)",
    )


def from_args(args: argparse.Namespace) -> NetworkSettings:
    """The flags as settings; raises SelectorError naming the flag."""
    operator_pods = parse_selector(args.operator_pod_selector, "--operator-pod-selector")
    if not operator_pods:
        raise SelectorError("--operator-pod-selector: empty, which would admit every pod of the namespace")
    namespace = parse_selector(f"{NAMESPACE_NAME_LABEL}={args.operator_namespace}", "--operator-namespace")
    return NetworkSettings(
        enabled=args.network_policy,
        operator=Peer(namespace, operator_pods),
        prometheus=Peer(
            parse_selector(args.prometheus_namespace_selector, "--prometheus-namespace-selector"),
            parse_selector(args.prometheus_pod_selector, "--prometheus-pod-selector"),
        ),
    )
