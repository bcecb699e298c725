"""Where the e2e scenarios run: the local sandbox (default) or an existing cluster (a kubeconfig).

On the sandbox the session's real operator runs as a local process (tests/operator_plugin.py);
on a cluster the operator is already installed (the Helm chart) and is not touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from moe_operator.handlers.kube import connection
from moe_sandbox.cluster import Sandbox
from operator_harness import OperatorProcess


def client_from_kubeconfig(path: Path, timeout: float = 30.0) -> httpx.Client:
    """A raw REST client for any kubeconfig (client certs, bearer tokens, exec plugins)."""
    conn = connection(str(path), in_cluster=False)
    return httpx.Client(base_url=conn.host, verify=conn.tls, headers=conn.headers, timeout=timeout)


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
