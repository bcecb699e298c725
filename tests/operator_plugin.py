"""pytest plugin: the real operator as one session fixture, shared by tests/ and e2e/scenarios/.

Both conftests load it with ``pytest_plugins``; a plugin is registered once per session, so a
run over both trees starts one operator, never two fighting over the same sandbox.
"""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from moe_sandbox.cluster import Sandbox
from operator_harness import EXAMPLE_GRANTS, OperatorProcess, bind_model_volume, install_crd, moed_path


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


@pytest.fixture()
def deployed(api: httpx.Client, namespace: str, moe_operator: OperatorProcess) -> Iterator[str]:
    """A namespace with the model volume bound; its MoEDeployments are deleted afterwards
    (the control-loop and autoscaler tests'; other trees define their own)."""
    bind_model_volume(api, namespace, "models")
    yield namespace
    for item in api.get(moed_path(namespace)).json()["items"]:
        api.delete(moed_path(namespace, item["metadata"]["name"]))
