"""What Prometheus does with a PodMonitor endpoint for one pod's container port: the Prometheus
Operator keeps the named port, then the endpoint's relabelings run (keep, replace)."""

from __future__ import annotations

import re
from typing import Any


def meta_label(label: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def selects(monitor: dict[str, Any], pod: dict[str, Any]) -> bool:
    """The PodMonitor's label selector (matchLabels) against a pod template's labels."""
    wanted = monitor["spec"]["selector"].get("matchLabels", {})
    return bool(wanted.items() <= pod["metadata"]["labels"].items())


def relabel(pod: dict[str, Any], port: dict[str, Any], endpoint: dict[str, Any]) -> dict[str, str] | None:
    """The target labels of scraping ``port`` of ``pod`` through ``endpoint`` (None: dropped)."""
    if port.get("name") != endpoint["port"]:
        return None
    out = {meta_label(k): v for k, v in pod["metadata"]["labels"].items()}
    out["__meta_kubernetes_pod_name"] = pod["metadata"].get("name", "pod-0")
    out["__meta_kubernetes_pod_container_port_name"] = port["name"]
    for r in endpoint.get("relabelings", []):
        value = ";".join(out.get(s, "") for s in r["sourceLabels"])
        action = r.get("action", "replace")
        if action == "keep":
            if not re.fullmatch(r.get("regex", "(.*)"), value):
                return None
        elif action == "replace":
            out[r["targetLabel"]] = value
        else:
            raise AssertionError(f"relabel action {action} not simulated")
    return {k: v for k, v in out.items() if not k.startswith("__") and v}


def targets(
    monitor: dict[str, Any], pods: list[dict[str, Any]]
) -> dict[str, list[tuple[int, dict[str, str]]]]:
    """Per endpoint port name: (container port, target labels) of every target the monitor scrapes."""
    out: dict[str, list[tuple[int, dict[str, str]]]] = {}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        found = out.setdefault(endpoint["port"], [])
        for pod in pods:
            if not selects(monitor, pod):
                continue
            for container in pod["spec"]["containers"]:
                for port in container.get("ports", []):
                    labels = relabel(pod, port, endpoint)
                    if labels is not None:
                        found.append((port["containerPort"], labels))
    return out
