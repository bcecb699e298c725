"""Throwaway PKI for the sandbox: one CA, a serving cert, an admin client cert, a SA key pair.

Uses the `openssl` command (present on every Debian/Ubuntu machine) so the operator's
install does not grow a crypto dependency just for a local test cluster.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def complete(self) -> bool:
        files = (self.ca_cert, self.ca_key, self.serving_cert, self.serving_key)
        return all(p.exists() for p in (*files, self.admin_cert, self.admin_key, self.sa_key, self.sa_pub))


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _issue(pki: Pki, name: str, subject: str, extensions: str) -> None:
    d = pki.dir
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=d)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "365", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=d,
    )  # fmt: skip


def ensure_pki(directory: Path) -> Pki:
    """Create the PKI once; reuse it on later `up` calls so kubeconfigs stay valid."""
    pki = Pki(directory)
    if pki.complete():
        return pki
    if shutil.which("openssl") is None:
        raise RuntimeError("the sandbox needs the `openssl` command (Debian package openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=moe-sandbox-ca", "-days", "365",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", "ca.crt",
        cwd=directory,
    )  # fmt: skip
    _issue(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1\n",
    )
    _issue(
        pki,
        "admin",
        "/O=system:masters/CN=moe-sandbox-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return pki


def issue_client_cert(
    pki: Pki, name: str, user: str, groups: tuple[str, ...] = ("system:masters",)
) -> tuple[Path, Path]:
    """A client cert for a named user (so the API server's audit log can tell clients apart)."""
    crt, key = pki.dir / f"{name}.crt", pki.dir / f"{name}.key"
    if not (crt.exists() and key.exists()):
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        _issue(
            pki,
            name,
            subject,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n",
        )
    return crt, key


def issue_serving_cert(pki: Pki, name: str, hosts: list[str]) -> tuple[Path, Path]:
    """A serving cert signed by the sandbox CA (used for the operator's admission webhook)."""
    sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    _issue(
        pki,
        name,
        f"/CN={hosts[0]}",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
    )
    return pki.dir / f"{name}.crt", pki.dir / f"{name}.key"
