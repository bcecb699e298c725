"""Shared helpers of the runtime tests (imported as rt_helpers): ports, waits, skips."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
FAKE_ENGINE = Path(__file__).parent / "fake_engine"


def require_sglang() -> None:
    """Skip (with the reason) when torch or the real sglang package cannot be imported."""
    for name in ("torch", "sglang.srt.eplb.eplb_algorithms", "sglang.srt.plugins.hook_registry"):
        try:
            importlib.import_module(name)
        except Exception as exc:
            pytest.skip(
                f"{name} not importable ({type(exc).__name__}: {exc}); "
                "create the runtime venv with `bash runtime/scripts/setup-test-env.sh` and run "
                "`.venv-runtime/bin/pytest -m runtime tests/runtime`"
            )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # connection refused while starting, ...
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or predicate}: last={last!r}")


def runtime_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "moe_runtime.cli", *args]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        runtime_cmd(*args), capture_output=True, text=True, env=full_env, timeout=timeout, check=False
    )


def metric(text: str, name: str, **labels: str) -> float | None:
    """Value of one sample in Prometheus text, or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None
