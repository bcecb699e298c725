"""The admission webhook's TLS material: a CA of the operator's own and a serving certificate it signs.

Used when no certificate is given (``moe-operator run`` without --webhook-cert, e.g. outside a
cluster with cert-manager). The CA signs nothing but this serving certificate and mints no
client credentials. Both are reissued when they near expiry; the pure ``needs_renewal`` decides.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_VALIDITY = timedelta(days=365)
SERVING_VALIDITY = timedelta(days=90)
RENEW_BEFORE = timedelta(days=30)
_CA_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True)
class WebhookCerts:
    """Paths of the CA bundle the apiserver trusts and of the serving certificate and key."""

    ca_cert: Path
    cert: Path
    key: Path


def needs_renewal(cert_pem: bytes, hosts: Sequence[str], now: datetime, renew_before: timedelta) -> bool:
    """A certificate that expires within ``renew_before`` or does not name every host."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    if cert.not_valid_after_utc - now <= renew_before:
        return True
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return bool(hosts)
    names = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    names |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return not set(hosts) <= names


def ensure_webhook_certs(
    directory: Path, hosts: Sequence[str], now: datetime | None = None, renew_before: timedelta = RENEW_BEFORE
) -> WebhookCerts:
    """The CA and serving certificate in ``directory``, (re)issued where missing or near expiry."""
    now = now or datetime.now(UTC)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    out = WebhookCerts(directory / "ca.crt", directory / "webhook.crt", directory / "webhook.key")
    ca_key_path = directory / "ca.key"
    renew_ca = not (out.ca_cert.exists() and ca_key_path.exists()) or needs_renewal(
        out.ca_cert.read_bytes(), [], now, renew_before
    )
    if renew_ca:
        new_ca_key = ec.generate_private_key(ec.SECP256R1())
        _write_key(ca_key_path, new_ca_key)
        out.ca_cert.write_bytes(_ca_cert(new_ca_key, now).public_bytes(serialization.Encoding.PEM))
    if renew_ca or not out.cert.exists() or needs_renewal(out.cert.read_bytes(), hosts, now, renew_before):
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{ca_key_path} is not the EC key this operator writes; remove {directory}")
        ca = x509.load_pem_x509_certificate(out.ca_cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(out.key, key)
        serving = _serving_cert(ca, ca_key, key, hosts, now)
        out.cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    return out


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)


def _ca_cert(key: ec.EllipticCurvePrivateKey, now: datetime) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "moe-operator webhook CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )


def _serving_cert(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    hosts: Sequence[str],
    now: datetime,
) -> x509.Certificate:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    not_after = min(now + SERVING_VALIDITY, ca.not_valid_after_utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "webhook")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


# --------------------------------------------------------------------------- shared by replicas

SECRET_KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
_FILES = {"ca.crt": "ca.crt", "ca.key": "ca.key", "tls.crt": "webhook.crt", "tls.key": "webhook.key"}


def secret_data(directory: Path) -> dict[str, str]:
    """The PKI files of ``directory`` as Secret data (base64), under the kubernetes.io/tls names."""
    return {key: base64.b64encode((directory / name).read_bytes()).decode() for key, name in _FILES.items()}


def write_secret_data(directory: Path, data: dict[str, str]) -> bool:
    """Write a Secret's PKI into ``directory``; False when it lacks a part (then nothing is written)."""
    if not all(isinstance(data.get(k), str) for k in SECRET_KEYS):
        return False
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for key, name in _FILES.items():
        path = directory / name
        raw = base64.b64decode(data[key])
        if name.endswith(".key"):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
        else:
            path.write_bytes(raw)
    return True
