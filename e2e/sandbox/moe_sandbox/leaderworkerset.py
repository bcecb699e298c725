"""Install the real LeaderWorkerSet controller into a running sandbox (and take it out again).

The controller is built from its upstream module (``toolchain``), runs as a local process
like the control plane, and serves its webhooks on loopback with a certificate from the
sandbox CA. The webhook configurations are upstream's, with a URL instead of a Service
(the sandbox has no Service routing) and without the controller's own cert rotation.
"""

from __future__ import annotations

import base64
import shutil
import time
from typing import Any

import httpx
import yaml

from moe_sandbox import toolchain
from moe_sandbox.cluster import Log, Sandbox, SandboxError, server_side_apply
from moe_sandbox.pki import issue_serving_cert

ADDON = "lws-controller"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
LWS_API = "/apis/leaderworkerset.x-k8s.io/v1"
WEBHOOK_NAME = "moe-sandbox-lws"
FIELD_MANAGER = "moe-sandbox"
_LWS_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}


def _webhook(name: str, path: str, url: str, ca: str, resource: str, ops: list[str]) -> dict[str, Any]:
    group = "leaderworkerset.x-k8s.io" if resource == "leaderworkersets" else ""
    hook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": f"{url}{path}", "caBundle": ca},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ops, "resources": [resource]}],
    }
    if resource == "pods":
        hook["objectSelector"] = _LWS_SELECTOR  # only the pods LeaderWorkerSets create
    return hook


def webhook_configurations(url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """Upstream's four webhooks (v0.7.0 chart), pointed at a URL."""
    ca = base64.b64encode(ca_pem).decode()
    lws_ops = ["CREATE", "UPDATE"]
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [
                _webhook(
                    "mleaderworkerset.kb.io",
                    "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                    url,
                    ca,
                    "leaderworkersets",
                    lws_ops,
                ),
                _webhook("mpod.kb.io", "/mutate--v1-pod", url, ca, "pods", ["CREATE"]),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [
                _webhook(
                    "vleaderworkerset.kb.io",
                    "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                    url,
                    ca,
                    "leaderworkersets",
                    lws_ops,
                ),
                _webhook("vpod.kb.io", "/validate--v1-pod", url, ca, "pods", ["CREATE", "UPDATE"]),
            ],
        },
    ]


def install(box: Sandbox, log: Log = print) -> float:
    """CRD, webhooks and a running controller (idempotent); returns the seconds it took."""
    started = time.monotonic()
    toolchain.ensure_built(log)
    if box.pid(ADDON) is None:
        home = box.dir / "lws"
        certs = home / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        crt, key = issue_serving_cert(box.pki, "lws-webhook", ["127.0.0.1"])
        shutil.copyfile(crt, certs / "tls.crt")
        shutil.copyfile(key, certs / "tls.key")
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": box.ports.lws_webhook, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{box.ports.lws_health}"},
        }
        (home / "config.yaml").write_text(yaml.safe_dump(config))
        log(f"starting the LeaderWorkerSet controller {toolchain.LWS_VERSION}")
        box.start_addon(
            ADDON,
            [
                str(toolchain.binary_path(ADDON)),
                f"--config={home / 'config.yaml'}",
                f"--kubeconfig={box.kubeconfig}",
            ],
        )
    with box.client(timeout=60) as c:
        crd = yaml.load(
            toolchain.lws_crd_file().read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )
        server_side_apply(c, f"{CRD_PATH}/{CRD_NAME}", crd, FIELD_MANAGER)
        url = f"https://127.0.0.1:{box.ports.lws_webhook}"
        for obj in webhook_configurations(url, box.pki.ca_cert.read_bytes()):
            kind = obj["kind"].lower() + "s"
            server_side_apply(
                c,
                f"/apis/admissionregistration.k8s.io/v1/{kind}/{obj['metadata']['name']}",
                obj,
                FIELD_MANAGER,
            )
        box.wait_ready(ADDON, lambda: _healthy(box), 60)
        box.wait_ready(ADDON, lambda: c.get(f"{LWS_API}/leaderworkersets").status_code == 200, 60)
    return time.monotonic() - started


def _healthy(box: Sandbox) -> bool:
    return httpx.get(f"http://127.0.0.1:{box.ports.lws_health}/readyz", timeout=1).status_code == 200


def uninstall(box: Sandbox, log: Log = print, timeout: float = 120) -> bool:
    """Delete every LeaderWorkerSet (the CRD's deletion does that), the webhooks and the controller;
    returns whether the CRD was there."""
    with box.client(timeout=30) as c:
        existed = c.delete(f"{CRD_PATH}/{CRD_NAME}").status_code != 404
        deadline = time.monotonic() + timeout
        while c.get(f"{CRD_PATH}/{CRD_NAME}").status_code != 404:
            if time.monotonic() > deadline:
                raise SandboxError(f"the {CRD_NAME} CRD was not gone {timeout:.0f}s after its deletion")
            time.sleep(0.5)
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            c.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_NAME}")
    pid = box.pid(ADDON)
    if pid is not None:
        log(f"stopping the LeaderWorkerSet controller (pid {pid})")
        box.stop_addon(ADDON)
    return existed
