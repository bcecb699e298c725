"""A small Kubernetes REST client: server-side apply with one field manager, counted requests.

kopf watches and indexes; writes go through here so every write is a named, counted
server-side apply (or an explicit delete) and tests can prove "zero writes when idle".
"""

from __future__ import annotations

import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import httpx
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from moe_operator.api import keys as K
from moe_operator.api.names import API_VERSION, KIND, PLURAL
from moe_operator.handlers.priority_pool import PriorityPool
from moe_operator.reconcile.children import apply_waves

# (apiVersion, kind) -> (URL prefix, plural)
_KINDS = MappingProxyType(
    {
        ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
        ("v1", "Service"): ("/api/v1", "services"),
        ("v1", "Secret"): ("/api/v1", "secrets"),
        ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
        ("v1", "Pod"): ("/api/v1", "pods"),
        ("apps/v1", "StatefulSet"): ("/apis/apps/v1", "statefulsets"),
        ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
        ("policy/v1", "PodDisruptionBudget"): ("/apis/policy/v1", "poddisruptionbudgets"),
        ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies"),
        ("monitoring.coreos.com/v1", "PodMonitor"): ("/apis/monitoring.coreos.com/v1", "podmonitors"),
        ("monitoring.coreos.com/v1", "PrometheusRule"): ("/apis/monitoring.coreos.com/v1", "prometheusrules"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
            "/apis/leaderworkerset.x-k8s.io/v1",
            "leaderworkersets",
        ),
        ("resource.nvidia.com/v1beta1", "ComputeDomain"): (
            "/apis/resource.nvidia.com/v1beta1",
            "computedomains",
        ),
        (API_VERSION, KIND): (f"/apis/{API_VERSION}", PLURAL),
    }
)


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    prefix, plural = _KINDS[(api_version, kind)]
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{collection_path(obj['apiVersion'], obj['kind'], meta['namespace'])}/{meta['name']}"


class KubeError(RuntimeError):
    """A refused request, with the parts of the apiserver's Status object callers branch on."""

    def __init__(
        self, status: int, message: str, reason: str = "", kind: str = "", causes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.reason = reason  # Status.reason, e.g. NotFound, Forbidden, Conflict
        self.kind = kind  # Status.details.kind: the kind of the object the error is about
        self.causes = causes  # Status.details.causes[].reason (or .type)

    @property
    def namespace_gone(self) -> bool:
        """The namespace is being deleted (creates refused) or is gone."""
        if self.status == 404 and self.kind == "namespaces":
            return True
        return self.status == 403 and "NamespaceTerminating" in self.causes

    @classmethod
    def from_response(cls, resp: httpx.Response) -> KubeError:
        try:
            body = resp.json()
        except ValueError:
            return cls(resp.status_code, resp.text[:500])
        if not isinstance(body, dict):
            return cls(resp.status_code, resp.text[:500])
        raw_details = body.get("details")
        details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
        causes = tuple(
            str(c.get("reason") or c.get("type") or "")
            for c in details.get("causes") or []
            if isinstance(c, dict)
        )
        return cls(
            resp.status_code,
            str(body.get("message", resp.text[:500])),
            str(body.get("reason") or ""),
            str(details.get("kind") or ""),
            causes,
        )


@dataclass(frozen=True)
class Connection:
    """Where an API server is and how to authenticate to it, for a raw httpx client."""

    host: str
    tls: ssl.SSLContext
    headers: dict[str, str]


def _load_in_cluster(cfg: k8s_client.Configuration) -> bool:
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        return False
    return True


def connection(kubeconfig: str | None = None, in_cluster: bool = True) -> Connection:
    """From the in-cluster service account (when in_cluster and there is one), else a kubeconfig
    (client certificates, bearer tokens, exec plugins, insecure-skip-tls-verify)."""
    cfg = k8s_client.Configuration()
    if not (in_cluster and _load_in_cluster(cfg)):
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    tls = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    if cfg.cert_file and cfg.key_file:
        tls.load_cert_chain(cfg.cert_file, cfg.key_file)
    headers = {}
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if token:
        headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    return Connection(cfg.host, tls, headers)


class Kube:
    """Thread-safe; one per operator process."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        apply_concurrency: int = 8,
        on_request: Callable[[str], None] | None = None,
    ) -> None:
        """``on_request(verb)`` is called for every request sent (the operator counts them in a metric)."""
        conn = connection(kubeconfig)
        self.requests: Counter[str] = Counter()
        self._on_request = on_request
        self._lock = threading.Lock()
        self._apply_pool = PriorityPool(apply_concurrency, "apply") if apply_concurrency > 1 else None
        self._http = httpx.Client(
            base_url=conn.host,
            verify=conn.tls,
            headers=conn.headers,
            timeout=httpx.Timeout(30.0, connect=10.0),
            event_hooks={"request": [self._count]},
        )

    def _count(self, request: httpx.Request) -> None:
        verb = request.method.lower()
        with self._lock:
            self.requests[verb] += 1
        if self._on_request is not None:
            self._on_request(verb)

    @property
    def writes(self) -> int:
        with self._lock:
            return sum(n for verb, n in self.requests.items() if verb not in ("get",))

    def _check(self, resp: httpx.Response) -> dict[str, Any]:
        if resp.status_code >= 400:
            raise KubeError.from_response(resp)
        return resp.json() if resp.content else {}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's single field manager (force: the operator owns it)."""
        resp = self._http.patch(
            object_path(obj),
            params={"fieldManager": K.FIELD_MANAGER, "force": "true"},
            json=obj,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        return self._check(resp)

    def apply_in_waves(self, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply objects in the waves of ``apply_waves``, each wave's objects at once; returns them
        in the order applied. The first failure is raised after its wave.

        A reconcile's applies are independent writes, so one deployment's children take about
        three round trips instead of one per object (apply_concurrency=1: one by one, in order).
        The pool is shared by every reconcile and serves the reconcile that started first, wave
        by wave: in a burst, one deployment's StatefulSets go ahead of the next deployments'
        objects, so its pods start while the rest is written, and its reconcile (and the handler
        thread it holds) ends before later ones queue behind it.
        """
        started = time.monotonic()
        applied: list[dict[str, Any]] = []
        for wave_index, wave in enumerate(apply_waves(objects)):
            if self._apply_pool is None or len(wave) == 1:
                for obj in wave:
                    self.apply(obj)
            else:
                futures = [self._apply_pool.submit((started, wave_index), self.apply, o) for o in wave]
                for future in futures:
                    future.result()
            applied += wave
        return applied

    def replace(self, obj_path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT with the object's resourceVersion: a 409 means someone changed it first."""
        return self._check(self._http.put(obj_path, params={"fieldManager": K.FIELD_MANAGER}, json=obj))

    def merge_patch(self, obj_path: str, patch: dict[str, Any], field_manager: str) -> dict[str, Any]:
        resp = self._http.patch(
            obj_path,
            params={"fieldManager": field_manager},
            json=patch,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return self._check(resp)

    def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create once; None if it already exists."""
        meta = obj["metadata"]
        resp = self._http.post(
            collection_path(obj["apiVersion"], obj["kind"], meta["namespace"]),
            params={"fieldManager": K.FIELD_MANAGER},
            json=obj,
        )
        if resp.status_code == 409:
            return None
        return self._check(resp)

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any] | None:
        resp = self._http.get(path, params=params)
        if resp.status_code == 404:
            return None
        return self._check(resp)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        resp = self._http.delete(
            f"{collection_path(api_version, kind, namespace)}/{name}",
            params={"propagationPolicy": "Background"},
        )
        if resp.status_code != 404:
            self._check(resp)

    def delete_pod(self, namespace: str, name: str, grace_period_s: int) -> None:
        resp = self._http.delete(
            f"{collection_path('v1', 'Pod', namespace)}/{name}",
            params={"gracePeriodSeconds": str(grace_period_s)},
        )
        if resp.status_code != 404:
            self._check(resp)

    def delete_pods(self, namespace: str, selector: dict[str, str]) -> None:
        """Delete every pod matching the selector in one request (a whole group at once)."""
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        resp = self._http.delete(
            collection_path("v1", "Pod", namespace),
            params={"labelSelector": label_selector, "gracePeriodSeconds": "30"},
        )
        self._check(resp)

    def close(self) -> None:
        if self._apply_pool is not None:
            self._apply_pool.shutdown()
        self._http.close()
