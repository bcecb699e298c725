"""`moe-operator plan` prints the topology plan of a spec without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moe_operator.cli import main

REPO = Path(__file__).resolve().parents[2]


GRANTS = ("--policy", str(REPO / "policies" / "platform" / "examples.yaml"))  # what the examples need


def test_plan_gb200_example_uses_one_clique_per_instance(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(REPO / "examples" / "deepseek-v3-gb200.yaml")
    assert main(["plan", *GRANTS, "-f", example, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert not out["waiting"]
    decode = [p for p in out["placements"] if p["pool"] == "decode"]
    assert [(p["kind"], len(p["nodes"])) for p in decode] == [("nvlink", 12)]
    # No RDMA NIC in the pods (gb200-nvl72): the KV cache moves over NVLink only inside one rack, so
    # the three 2-tray prefill instances fill the rest of the decode instance's rack.
    prefill = [p for p in out["placements"] if p["pool"] == "prefill"]
    assert [(p["kind"], len(p["nodes"])) for p in prefill] == [("nvlink", 2)] * 3
    assert {p["domain"] for p in out["placements"]} == {decode[0]["domain"]}


def test_plan_reports_waiting_with_exit_code_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v3-pd-h100.yaml").read_text())
    doc["spec"]["decode"]["replicas"] = 3  # two racks of 16: the third 9-node instance cannot fit
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    assert main(["plan", *GRANTS, "-f", str(spec)]) == 3
    assert (
        "decode     2  WAITING  decode instance 2 needs 9 nodes with 8 free GPUs" in capsys.readouterr().out
    )
