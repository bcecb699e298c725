"""The webhook's own CA and serving certificate: issued, trusted by TLS, renewed before expiry."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509

from moe_operator.certs import RENEW_BEFORE, SERVING_VALIDITY, ensure_webhook_certs, needs_renewal

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
