"""e2e scenarios: the local sandbox by default, an existing cluster with E2E_KUBECONFIG or --kubeconfig.

The sandbox, its operator process and the per-test namespace are the shared fixtures of
moe_sandbox.testing and tests/operator_plugin.py (one of each per session, also
when this tree runs together with tests/). Chaos scenarios record recovery times that the
run prints at the end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "tests"))  # operator_harness, operator_plugin
# The helpers below import the fixture plugin before pytest_plugins loads it: rewrite it anyway.
pytest.register_assert_rewrite("moe_sandbox.testing")

from e2e_moe import RECOVERIES, Recovery, moed_path  # noqa: E402
from e2e_target import Target  # noqa: E402

from operator_harness import bind_model_volume  # noqa: E402

pytest_plugins = ["moe_sandbox.testing", "operator_plugin"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubeconfig",
        default=None,
        help="run the e2e scenarios against this cluster (operator already installed) instead of the sandbox; "
        "default: $E2E_KUBECONFIG",
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RECOVERIES:
        terminalreporter.section("e2e recovery times")
        for scenario, what, seconds in RECOVERIES:
            terminalreporter.write_line(f"{seconds:7.1f} s  {scenario.removeprefix('test_')}: {what}")


@pytest.fixture()
def recovery(request: pytest.FixtureRequest) -> Recovery:
    return Recovery(request.node.name)


def _kubeconfig(config: pytest.Config) -> Path | None:
    value = config.getoption("--kubeconfig", default=None) or os.environ.get("E2E_KUBECONFIG")
    return Path(value).expanduser() if value else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sandbox_only(why): needs the sandbox's internals; skipped (saying why) on a cluster"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip sandbox-only scenarios before their fixtures create anything on a real cluster."""
    marker = item.get_closest_marker("sandbox_only")
    kubeconfig = _kubeconfig(item.config)
    if marker is not None and kubeconfig is not None:
        pytest.skip(f"sandbox-only scenario ({marker.args[0]}); the target is the cluster of {kubeconfig}")


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> Target:
    kubeconfig = _kubeconfig(request.config)
    if kubeconfig:
        return Target("cluster", kubeconfig)
    box = request.getfixturevalue("sandbox")
    return Target("sandbox", box.kubeconfig, box, request.getfixturevalue("moe_operator"))


@pytest.fixture()
def api(target: Target) -> Iterator[httpx.Client]:
    """Overrides the sandbox plugin's admin client, so `namespace` works on either target."""
    with target.client(timeout=30) as client:
        yield client


@pytest.fixture()
def deployed(api: httpx.Client, namespace: str, target: Target) -> Iterator[str]:
    """The test's namespace, with the example model claims bound on the sandbox; its
    MoEDeployments are deleted afterwards (the namespace goes too)."""
    if target.sandbox is not None:
        for claim in ("models", "qwen3-30b-a3b"):
            bind_model_volume(api, namespace, claim)
    yield namespace
    listed = api.get(moed_path(namespace))
    for item in listed.json()["items"] if listed.status_code == 200 else []:
        api.delete(moed_path(namespace, item["metadata"]["name"]))
