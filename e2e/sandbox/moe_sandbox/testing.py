"""pytest fixtures over the sandbox: one control plane shared by the whole test session.

Load with ``pytest_plugins = ["moe_sandbox.testing"]``. Tests get their own
state directory and port range, so they never touch a sandbox the user started by hand.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Ports, Sandbox
from moe_sandbox.paths import cache_root

TEST_PORT_BASE = int(os.environ.get("MOE_TEST_PORT_BASE", "17000"))


def test_sandbox_dir() -> Path:
    return Path(os.environ.get("MOE_TEST_SANDBOX_DIR") or cache_root() / "test-sandbox")


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """The session's sandbox: started once, stopped when the session ends (also on failure)."""
    box = Sandbox(test_sandbox_dir(), Ports(TEST_PORT_BASE))

    def log(msg: str) -> None:
        print(f"[sandbox] {msg}", file=sys.stderr, flush=True)

    try:
        seconds = box.up(log=log)
        log(f"up in {seconds:.1f}s")
        yield box
    finally:
        box.down(log=log)


@pytest.fixture(scope="session")
def kubeconfig(sandbox: Sandbox) -> Path:
    return sandbox.kubeconfig


@pytest.fixture()
def api(sandbox: Sandbox) -> Iterator[httpx.Client]:
    """An admin REST client for the sandbox apiserver."""
    with sandbox.client(timeout=30) as client:
        yield client


@pytest.fixture()
def namespace(api: httpx.Client) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
    # The ServiceAccount admission plugin refuses pods until the default SA exists.
    wait_for(lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200, 30)
    yield name
    api.delete(f"/api/v1/namespaces/{name}")


def wait_for(predicate: Any, timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll until predicate() returns something truthy; return it or fail with `what`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def load_yaml(text: str) -> Any:
    return yaml.safe_load(text)
