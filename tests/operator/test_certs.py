"""The webhook's own CA and serving certificate: issued, trusted by TLS, renewed before expiry."""

from __future__ import annotations

import json
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509

from moe_operator.certs import RENEW_BEFORE, SERVING_VALIDITY, ensure_webhook_certs, needs_renewal
from moe_operator.handlers.kube import KubeError

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_issued_certificate_loads_into_tls_and_names_every_host(tmp_path: Path) -> None:
    certs = ensure_webhook_certs(tmp_path, ["moe-operator.moe-system.svc", "127.0.0.1"], NOW)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.cert, certs.key)  # key matches the certificate
    trust = ssl.create_default_context(cafile=str(certs.ca_cert))
    assert trust.cert_store_stats()["x509_ca"] == 1
    cert = x509.load_pem_x509_certificate(certs.cert.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(certs.ca_cert.read_bytes()))
    assert not needs_renewal(
        certs.cert.read_bytes(), ["moe-operator.moe-system.svc", "127.0.0.1"], NOW, RENEW_BEFORE
    )
    assert oct(certs.key.stat().st_mode & 0o777) == "0o600"


def test_kept_while_valid_and_reissued_near_expiry_or_for_new_hosts(tmp_path: Path) -> None:
    first = ensure_webhook_certs(tmp_path, ["a.svc"], NOW).cert.read_bytes()
    assert ensure_webhook_certs(tmp_path, ["a.svc"], NOW + timedelta(days=1)).cert.read_bytes() == first
    late = NOW + SERVING_VALIDITY - RENEW_BEFORE + timedelta(hours=1)
    renewed = ensure_webhook_certs(tmp_path, ["a.svc"], late).cert.read_bytes()
    assert renewed != first
    assert x509.load_pem_x509_certificate(renewed).not_valid_after_utc > late + RENEW_BEFORE
    moved = ensure_webhook_certs(tmp_path, ["b.svc"], late).cert.read_bytes()
    assert moved != renewed and not needs_renewal(moved, ["b.svc"], late, RENEW_BEFORE)


class _Secrets:
    """The three calls the shared-certificate code makes, with the apiserver's conflict rules."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0

    def get(self, path: str) -> dict[str, Any] | None:
        return None if self.obj is None else json.loads(json.dumps(self.obj))

    def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        if self.obj is not None:
            return None
        self.version += 1
        self.obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        return self.obj

    def replace(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.obj is not None
        if obj["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "conflict")
        return self.create_over(obj)

    def create_over(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.obj = None
        created = self.create(obj)
        assert created is not None
        return created


def test_replicas_share_one_webhook_certificate_through_a_secret(tmp_path: Path, monkeypatch: Any) -> None:
    from moe_operator.cli import webhook

    store = _Secrets()
    monkeypatch.setenv("MOE_WEBHOOK_CERT_DIR", str(tmp_path / "a"))
    a = webhook.shared_webhook_files(store, "moe-system", "moe-webhook", ["svc.moe-system.svc"])
    monkeypatch.setenv("MOE_WEBHOOK_CERT_DIR", str(tmp_path / "b"))
    b = webhook.shared_webhook_files(store, "moe-system", "moe-webhook", ["svc.moe-system.svc"])
    assert a[0].read_bytes() == b[0].read_bytes() and a[2].read_bytes() == b[2].read_bytes()
    assert store.version == 1, "the second replica wrote instead of reading"
    assert store.obj is not None and store.obj["type"] == "kubernetes.io/tls"
