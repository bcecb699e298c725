"""pytest plugin: the real operator as one session fixture, shared by tests/ and e2e/scenarios/.

Both conftests load it with ``pytest_plugins``; a plugin is registered once per session, so a
run over both trees starts one operator, never two fighting over the same sandbox.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from moe_sandbox.cluster import Sandbox
from operator_harness import EXAMPLE_GRANTS, OperatorProcess, install_crd


@pytest.fixture(scope="session")
def moe_operator(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The real operator (reconciler + webhook) running against the session's sandbox."""
    install_crd(sandbox)
    proc = OperatorProcess(sandbox, Path(tmp_path_factory.mktemp("operator")), extra_args=EXAMPLE_GRANTS)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
