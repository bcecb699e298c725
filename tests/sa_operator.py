"""The real operator authenticated as a ServiceAccount (a TokenRequest token), so it runs with exactly
the chart's RBAC; and the API server's audit log of what that ServiceAccount did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from operator_harness import WEBHOOK_CONFIG, remove_peering


def sa_kubeconfig(box: Sandbox, api: httpx.Client, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig with a token the API server issued to a ServiceAccount (TokenRequest)."""
    resp = api.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert resp.status_code == 201, resp.text
    token = resp.json()["status"]["token"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sandbox",
                "cluster": {"server": box.server, "certificate-authority": str(box.pki.ca_cert)},
            }
        ],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sandbox", "user": sa, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    review = api.post(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
    ).json()
    assert review["status"]["user"]["username"] == f"system:serviceaccount:{namespace}:{sa}"
    return path


def operator_port_base() -> int:
    return int(os.environ.get("MOE_TEST_OPERATOR_PORT_BASE", "19000"))


def shared_operator_live() -> bool:
    """Whether the session's `moe_operator` (tests/operator_harness.py ports) is running now."""
    try:
        return (
            httpx.get(f"http://127.0.0.1:{operator_port_base() + 80}/healthz", timeout=1).status_code == 200
        )
    except httpx.HTTPError:
        return False


@pytest.fixture()
def shared_operator_paused(request: pytest.FixtureRequest, api: httpx.Client) -> Iterator[None]:
    """Stop the session's operator, if an earlier test started it, while this test runs its own
    (only the ServiceAccount-authenticated operator may act); give it back afterwards. One that
    is not running is not started: later tests may rely on there being no webhook yet."""
    running: Any = request.getfixturevalue("moe_operator") if shared_operator_live() else None
    if running is not None:
        running.stop()
    yield
    api.delete(WEBHOOK_CONFIG)
    remove_peering(api)  # the chart and the RBAC manifests install kopf's peering CRDs
    if running is not None:
        running.start()


class ServiceAccountOperator:
    """`moe-operator run` with a ServiceAccount's token, on its own ports (operator base + 200)."""

    def __init__(
        self, box: Sandbox, api: httpx.Client, namespace: str, sa: str, tmp: Path, args: tuple[str, ...] = ()
    ) -> None:
        self.user = f"system:serviceaccount:{namespace}:{sa}"
        self.kubeconfig = sa_kubeconfig(box, api, namespace, sa, tmp / f"kubeconfig-{sa}")
        base = operator_port_base() + 200
        self.liveness, self.metrics, self.webhook = base + 80, base + 100, base + 443
        self.log_path = tmp / f"operator-{sa}.log"
        self.args = args
        self.box = box
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServiceAccountOperator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "moe_operator.cli", "run",
                    "--liveness", f"http://127.0.0.1:{self.liveness}/healthz",
                    "--metrics-port", str(self.metrics),
                    "--webhook-port", str(self.webhook),
                    "--runtime-image", "moe-runtime:test",
                    *self.args,
                ],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def live() -> bool:
            self.assert_running()
            try:
                return httpx.get(f"http://127.0.0.1:{self.liveness}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(live, 60, what="operator liveness")
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def assert_running(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.tail()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def audit(self) -> list[dict[str, Any]]:
        """Every request of this ServiceAccount the API server completed, from its audit log."""
        events = [json.loads(line) for line in self.box.audit_log.read_text().splitlines()]
        return [
            e for e in events if e.get("stage") == "ResponseComplete" and e["user"]["username"] == self.user
        ]
