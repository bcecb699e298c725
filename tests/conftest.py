"""Shared fixtures: the session-wide sandbox (moe_operator.sandbox.testing) and the real operator."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from moe_operator.sandbox.cluster import Sandbox
from operator_harness import OperatorProcess, install_crd

pytest_plugins = ["moe_operator.sandbox.testing"]


@pytest.fixture(scope="session")
def moe_operator(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The real operator (reconciler + webhook) running against the session's sandbox."""
    install_crd(sandbox)
    proc = OperatorProcess(sandbox, Path(tmp_path_factory.mktemp("operator")))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
