"""`moe-operator crds`: generate writes, check catches drift, validate reads manifests."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from moe_operator.api.names import CRD_FILENAME
from moe_operator.cli.crds import register

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    result: int = args.func(args)
    return result


def test_generate_then_check_then_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "api.md", tmp_path / "docs" / "api.md")
    assert run("crds", "check", "--root", str(tmp_path)) == 1  # nothing generated yet
    assert run("crds", "generate", "--root", str(tmp_path)) == 0
    assert run("crds", "check", "--root", str(tmp_path)) == 0
    crd = tmp_path / "crds" / CRD_FILENAME
    crd.write_text(crd.read_text().replace("maxItems: 64", "maxItems: 65", 1))
    capsys.readouterr()
    assert run("crds", "check", "--root", str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "-      maxItems: 65" in out.replace(" " * 10, "") or "maxItems: 65" in out


def test_validate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "examples" / "qwen3-235b-fp8-pd-h200-roce.yaml")
    # The example's hardware profile (h200-roce) puts its pods on the host network: refused under the
    # safe defaults, admitted where the platform grants it, as if the spec had said so itself.
    assert run("crds", "validate", example) == 1
    assert "spec.topology.hostNetwork: the platform does not allow" in capsys.readouterr().out
    policy = tmp_path / "values.yaml"
    policy.write_text("platform:\n  hostNetworkNamespaces: [rdma-*]\n")
    assert run("crds", "validate", "--policy", str(policy), "-n", "rdma-team", example) == 0
    assert run("crds", "validate", "--policy", str(policy), "-n", "web", example) == 1
    assert "allowed in: rdma-* (platform.hostNetworkNamespaces)" in capsys.readouterr().out
    policy.write_text("platform:\n  hostPathPrefixes: [/var]\n")
    assert run("crds", "validate", "--policy", str(policy), example) == 2
    assert "reaches /var/run" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: moe.inference.dev/v1alpha1\nkind: MoEDeployment\nmetadata: {name: x}\n"
        "spec: {model: {name: deepseek-v3}, engine: {extraArgs: ['--tp-size=8']}}\n"
    )
    assert run("crds", "validate", str(bad)) == 1
    out = capsys.readouterr().out
    assert "spec.engine.extraArgs[0]" in out and "spec.decode.nodesPerReplica" in out


def test_print_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("crds", "print") == 0
    assert "kind: CustomResourceDefinition" in capsys.readouterr().out
