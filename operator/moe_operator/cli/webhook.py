"""The webhook's serving certificate for `moe-operator run`: given, generated, or shared by replicas
through a Secret; the running operator restarts itself (SIGTERM, graceful) when its certificate is
renewed or nears expiry, because the webhook server reads it only at start."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moe_operator.api import keys as K

CHECK_INTERVAL_S = 3600.0


def _cert_dir() -> Path:
    """Where generated webhook certificates live (XDG cache, or $MOE_WEBHOOK_CERT_DIR)."""
    explicit = os.environ.get("MOE_WEBHOOK_CERT_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "moe-operator" / "webhook-pki"


def webhook_files(args: argparse.Namespace, kube: Any) -> tuple[Path, Path, Path]:
    if args.webhook_cert and args.webhook_key and args.webhook_ca:
        return args.webhook_cert, args.webhook_key, args.webhook_ca
    from moe_operator.certs import ensure_webhook_certs

    host = args.webhook_host or args.webhook_addr
    hosts = list(dict.fromkeys([host, "localhost", "127.0.0.1"]))
    if args.webhook_cert_secret:
        return shared_webhook_files(kube, args.webhook_cert_namespace, args.webhook_cert_secret, hosts)
    certs = ensure_webhook_certs(_cert_dir(), hosts)
    return certs.cert, certs.key, certs.ca_cert


def shared_webhook_files(kube: Any, namespace: str, name: str, hosts: list[str]) -> tuple[Path, Path, Path]:
    """The webhook PKI from a Secret every replica reads: the first one to start makes it, the one that
    finds it near expiry renews it (a conflict means another replica just did: its version is used)."""
    from moe_operator.certs import ensure_webhook_certs, secret_data, write_secret_data
    from moe_operator.handlers.kube import KubeError

    directory = _cert_dir() / f"{namespace}.{name}"
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    for _attempt in range(3):
        stored = kube.get(path)
        if stored is not None:
            write_secret_data(directory, stored.get("data") or {})
        certs = ensure_webhook_certs(directory, hosts)
        data = secret_data(directory)
        if stored is not None and stored.get("data") == data:
            return certs.cert, certs.key, certs.ca_cert
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": {K.MANAGED_BY_KEY: K.MANAGED_BY},
        }
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "data": data,
            "metadata": meta,
        }
        try:
            if stored is None:
                if kube.create(body) is not None:
                    return certs.cert, certs.key, certs.ca_cert
            else:
                meta["resourceVersion"] = stored["metadata"]["resourceVersion"]
                kube.replace(path, body)
                return certs.cert, certs.key, certs.ca_cert
        except KubeError as exc:
            if exc.status != 409:
                raise
    raise SystemExit(f"could not agree on the webhook certificate in Secret {namespace}/{name}; try again")


def watch_certificate(
    cert: Path, fresh: Callable[[], bytes | None], interval_s: float = CHECK_INTERVAL_S
) -> None:
    """Every ``interval_s``: when ``fresh()`` (the certificate as it should be now: the mounted file,
    or the shared Secret's) differs from the one being served, or it nears expiry, stop gracefully so
    the pod restarts with the new one (another replica serves meanwhile)."""
    from moe_operator.certs import RENEW_BEFORE, needs_renewal

    served = cert.read_bytes()

    def loop() -> None:
        while True:
            threading.Event().wait(interval_s)
            try:
                now_pem = fresh() or served
                stale = now_pem != served or needs_renewal(served, [], datetime.now(UTC), RENEW_BEFORE)
            except Exception as exc:  # a transient API error must not stop the check
                logging.getLogger(__name__).warning(f"webhook certificate check failed: {exc}")
                continue
            if stale:
                logging.getLogger(__name__).info(
                    "webhook certificate renewed or near expiry: restarting to serve it"
                )
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=loop, name="webhook-cert-watch", daemon=True).start()


def certificate_source(args: argparse.Namespace, kube: Any) -> Callable[[], bytes | None]:
    """Where the certificate that should be served now comes from (for ``watch_certificate``)."""
    import base64

    if args.webhook_cert and args.webhook_key and args.webhook_ca:
        return lambda: Path(
            args.webhook_cert
        ).read_bytes()  # a mounted Secret (cert-manager) updates in place
    if args.webhook_cert_secret:
        path = f"/api/v1/namespaces/{args.webhook_cert_namespace}/secrets/{args.webhook_cert_secret}"

        def from_secret() -> bytes | None:
            raw = ((kube.get(path) or {}).get("data") or {}).get("tls.crt")
            return base64.b64decode(raw) if isinstance(raw, str) else None

        return from_secret
    return lambda: None  # generated here: only its expiry matters
