"""Fixtures of the autoscaler's cluster test (the control tests' own, reused)."""

from collections.abc import Iterator

import httpx
import pytest

from operator_harness import OperatorProcess, bind_model_volume, moed_path


@pytest.fixture()
def deployed(api: httpx.Client, namespace: str, moe_operator: OperatorProcess) -> Iterator[str]:
    """A namespace with the model volume bound; its MoEDeployments are deleted afterwards."""
    bind_model_volume(api, namespace, "models")
    yield namespace
    for item in api.get(moed_path(namespace)).json()["items"]:
        api.delete(moed_path(namespace, item["metadata"]["name"]))
