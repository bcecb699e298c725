"""`moe-operator run --no-webhook` starts and reconciles (a cluster that enforces the admission
policies instead of the webhook must still be able to run the operator)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_reconciler import example, wait_ready

from moe_sandbox.cluster import Sandbox
from operator_harness import EXAMPLE_GRANTS, OperatorProcess, bind_model_volume, moed_path

pytestmark = pytest.mark.cluster


@pytest.fixture()
def without_webhook(
    sandbox: Sandbox, moe_operator: OperatorProcess, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The session's operator stopped, one with --no-webhook in its place; then the usual one again."""
    moe_operator.stop()
    bare = OperatorProcess(sandbox, tmp_path, extra_args=("--no-webhook", *EXAMPLE_GRANTS))
    try:
        bare.start()
        yield bare
    finally:
        bare.stop()
        moe_operator.start()


def test_operator_without_webhook_reconciles(
    api: httpx.Client, namespace: str, without_webhook: OperatorProcess
) -> None:
    bind_model_volume(api, namespace, "qwen3-30b-a3b")
    obj = example("qwen3-30b-a3b-single-node.yaml")
    obj["metadata"]["name"] = "nohook"
    assert api.post(moed_path(namespace), json=obj).status_code == 201
    wait_ready(api, namespace, "nohook")
    assert "Admission handlers exist" not in without_webhook.tail(200)
