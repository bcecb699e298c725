"""MoEDeployment helpers for the e2e scenarios: specs, waits, pods, events and metrics (REST only)."""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from moe_sandbox.testing import wait_for
from operator_harness import moed_path as moed_path  # re-exported for the scenarios

REPO = Path(__file__).resolve().parents[2]
SELECT_ENGINE = "moe.inference.dev/deployment={name},moe.inference.dev/instance"


def example(file: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / file).read_text())
    return obj


def qwen3(replicas: int, name: str = "qwen3-30b", **eplb: Any) -> dict[str, Any]:
    """The single-node Qwen3 example with `replicas` one-node decode instances: the leanest
    spec with several instances (each on its own H100 node, an NVLink domain of its own)."""
    obj = copy.deepcopy(example("qwen3-30b-a3b-single-node.yaml"))
    obj["metadata"]["name"] = name
    obj["spec"]["decode"]["replicas"] = replicas
    obj["spec"]["topology"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    obj["spec"]["monitoring"] = {"podMonitor": False, "prometheusRule": False}
    if eplb:
        obj["spec"]["eplb"].update(eplb)
    return obj


def get_moed(api: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = api.get(moed_path(namespace, name)).raise_for_status().json()
    return obj


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), {})


def is_ready(obj: dict[str, Any]) -> bool:
    """Ready=True for the current generation (a stale True after a spec change does not count)."""
    st = obj.get("status") or {}
    return condition(obj, "Ready").get("status") == "True" and st.get("observedGeneration") == obj[
        "metadata"
    ].get("generation")


def wait_ready(api: httpx.Client, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = get_moed(api, namespace, name)
        return obj if is_ready(obj) else None

    try:
        result: dict[str, Any] = wait_for(ready, timeout, interval=0.5, what=f"{name} Ready")
    except AssertionError:
        st = get_moed(api, namespace, name).get("status")
        raise AssertionError(f"{name} not Ready after {timeout:.0f}s: {json.dumps(st, indent=1)}") from None
    return result


def merge_patch(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = api.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def engine_pods(api: httpx.Client, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(
        f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": SELECT_ENGINE.format(name=name)}
    ).json()["items"]
    return items


def instance_of(pod: dict[str, Any]) -> tuple[str, int]:
    labels = pod["metadata"]["labels"]
    return labels["moe.inference.dev/pool"], int(labels["moe.inference.dev/instance"])


def by_instance(pods: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in pods:
        out.setdefault(instance_of(p), []).append(p)
    return out


def pod_serving(pod: dict[str, Any]) -> bool:
    """Running, Ready and not being deleted: the rank takes part in a serving world."""
    st = pod.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
    return ready and st.get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def identity(pods: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Pod name -> (uid, container restarts): equal before and after means untouched."""
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(
                int(c.get("restartCount", 0)) for c in (p.get("status") or {}).get("containerStatuses") or []
            ),
        )
        for p in pods
    }


def events(api: httpx.Client, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(f"/api/v1/namespaces/{namespace}/events").json()["items"]
    return [e for e in items if reason is None or e.get("reason") == reason]


def children(api: httpx.Client, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(kind, name, uid) of every object labelled with the deployment: duplicates or re-creations show."""
    out = []
    for kind, path in (
        ("StatefulSet", "/apis/apps/v1/namespaces/{ns}/statefulsets"),
        ("Deployment", "/apis/apps/v1/namespaces/{ns}/deployments"),
        ("Service", "/api/v1/namespaces/{ns}/services"),
        ("ConfigMap", "/api/v1/namespaces/{ns}/configmaps"),
        ("Secret", "/api/v1/namespaces/{ns}/secrets"),
        ("PodDisruptionBudget", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"),
        ("LeaderWorkerSet", "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets"),
    ):
        resp = api.get(
            path.format(ns=namespace), params={"labelSelector": f"moe.inference.dev/deployment={name}"}
        )
        if resp.status_code == 404 and kind == "LeaderWorkerSet":
            continue  # the cluster has no LeaderWorkerSet controller
        out += [(kind, i["metadata"]["name"], i["metadata"]["uid"]) for i in resp.json()["items"]]
    return sorted(out)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series over the samples whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? ([0-9.eE+-]+|NaN)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()) and m.group(2) != "NaN":
            total += float(m.group(2))
    return total


RECOVERIES: list[tuple[str, str, float]] = []


class Recovery:
    """Records (and prints at once) how long a scenario took to recover; never asserted on.
    conftest prints every record again in a summary section at the end of the run."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario

    def record(self, what: str, seconds: float) -> None:
        RECOVERIES.append((self.scenario, what, seconds))
        print(f"\n[recovery] {self.scenario}: {what}: {seconds:.1f}s", flush=True)


class Sampler:
    """Polls a probe in a background thread while chaos happens; keeps every sample."""

    def __init__(self, probe: Callable[[], Any], interval: float = 0.3) -> None:
        self.probe, self.interval = probe, interval
        self.samples: list[tuple[float, Any]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.probe()))
            except (httpx.HTTPError, KeyError, ValueError):
                self.errors += 1  # the API server may be down on purpose
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
