"""Where the e2e scenarios run: the local sandbox (default) or an existing cluster (a kubeconfig).

On the sandbox the session's real operator runs as a local process (tests/operator_plugin.py);
on a cluster the operator is already installed (the Helm chart) and is not touched.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from moe_operator.sandbox.cluster import Sandbox
from operator_harness import OperatorProcess


def client_from_kubeconfig(path: Path, timeout: float = 30.0) -> httpx.Client:
    """A raw REST client for any kubeconfig (client certs, bearer tokens, exec plugins)."""
    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:  # insecure-skip-tls-verify in the kubeconfig
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file and cfg.key_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    headers = {}
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if token:
        headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    return httpx.Client(base_url=cfg.host, verify=ctx, headers=headers, timeout=timeout)


@dataclass(frozen=True)
class Target:
    kind: str  # "sandbox" or "cluster"
    kubeconfig: Path
    sandbox: Sandbox | None = None
    operator: OperatorProcess | None = None

    def client(self, timeout: float = 30.0) -> httpx.Client:
        if self.sandbox is not None:
            return self.sandbox.client(timeout=timeout)
        return client_from_kubeconfig(self.kubeconfig, timeout)

    def require_sandbox(self) -> tuple[Sandbox, OperatorProcess]:
        """The sandbox and its operator process (tests marked sandbox_only are skipped elsewhere)."""
        if self.sandbox is None or self.operator is None:
            pytest.skip(f"sandbox-only scenario; the target is the cluster of {self.kubeconfig}")
        return self.sandbox, self.operator
