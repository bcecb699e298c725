"""spec.monitoring: one MoEDeployment's PodMonitor and PrometheusRule (monitoring.coreos.com/v1).

Pure: spec and owner in, objects out. The reconciler creates them only while the cluster serves
the Prometheus Operator's CRDs (``REQUIRED_RESOURCES``), and prunes them with the other
children when the spec turns them off.

The PodMonitor scrapes every engine pod on two ports, SGLang's own ``/metrics`` (``http``,
spec.engine.port; the launcher always passes ``--enable-metrics``) and the runtime's metrics
listener (``metrics``, moe_contract.pod.METRICS_PORT; never the token-protected API port), and the
router's metrics port (also named ``metrics``, told apart by the pods' app label); each endpoint
relabels the pod labels to the ``deployment`` and ``pool`` labels the alert rules group by. The PrometheusRule holds the
alerts of alert_rules scoped to this deployment, with its own balancedness threshold.
"""

from __future__ import annotations

import re
from typing import Any

from moe_contract import pod as P
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.render import labels as L
from moe_operator.render.alert_rules import Scope, Thresholds, alert_groups
from moe_operator.render.group import Owner

API_VERSION = "monitoring.coreos.com/v1"
# kind -> plural: what must be served (discovery of monitoring.coreos.com/v1) before creating.
REQUIRED_RESOURCES = {"PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
COMPONENT = "monitoring"
NAME_LABEL = "app.kubernetes.io/name"
ENGINE_NAME = "moe-engine"  # labels.base_labels of the prefill/decode pods
ROUTER_NAME = "moe-router"


def meta_label(label: str) -> str:
    """The Prometheus discovery label of a pod label (``moe.inference.dev/pool`` -> ...)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _metadata(spec: MoEDeploymentSpec, owner: Owner) -> dict[str, Any]:
    # The user's labels first: the operator's own (it finds its children by them) win a clash.
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": {**spec.monitoring.labels, **L.base_labels(owner.name, COMPONENT)},
        "ownerReferences": [owner.reference()],
    }


def _endpoint(port: str, app: str, *, pool: bool) -> dict[str, Any]:
    relabelings: list[dict[str, Any]] = [
        # Router and engine pods both have a port named http: keep the pods this endpoint is for.
        {"action": "keep", "sourceLabels": [meta_label(NAME_LABEL)], "regex": app},
        {"sourceLabels": [meta_label(K.DEPLOYMENT)], "targetLabel": "deployment"},
    ]
    if pool:
        relabelings.append({"sourceLabels": [meta_label(K.POOL)], "targetLabel": "pool"})
    relabelings.append({"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"})
    return {"port": port, "path": P.METRICS_PATH, "relabelings": relabelings}


def pod_monitor(spec: MoEDeploymentSpec, owner: Owner) -> dict[str, Any]:
    """Engine pods' SGLang (port http) and runtime (port metrics) metrics, the router's (port metrics)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": _metadata(spec, owner),
        "spec": {
            "selector": {"matchLabels": {K.DEPLOYMENT: owner.name, K.MANAGED_BY_KEY: K.MANAGED_BY}},
            "podMetricsEndpoints": [
                _endpoint("http", ENGINE_NAME, pool=True),
                _endpoint(P.METRICS_PORT_NAME, ENGINE_NAME, pool=True),
                _endpoint("metrics", ROUTER_NAME, pool=False),
            ],
        },
    }


def thresholds(spec: MoEDeploymentSpec) -> Thresholds:
    """The cluster-wide defaults with the deployment's imbalance threshold and duration."""
    m = spec.monitoring
    return Thresholds(min_balancedness=m.min_balancedness, imbalance_for=m.alert_for)


def prometheus_rule(spec: MoEDeploymentSpec, owner: Owner) -> dict[str, Any]:
    """The alerts of docs/alerts.md for this deployment only."""
    groups = alert_groups(thresholds(spec), Scope(owner.namespace, owner.name))
    return {
        "apiVersion": API_VERSION,
        "kind": "PrometheusRule",
        "metadata": _metadata(spec, owner),
        "spec": {"groups": groups},
    }


def monitoring_objects(spec: MoEDeploymentSpec, owner: Owner) -> list[dict[str, Any]]:
    """The objects spec.monitoring asks for (none when both are off)."""
    out = []
    if spec.monitoring.pod_monitor:
        out.append(pod_monitor(spec, owner))
    if spec.monitoring.prometheus_rule:
        out.append(prometheus_rule(spec, owner))
    return out
