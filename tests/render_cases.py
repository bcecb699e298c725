"""Pure rendering inputs shared by the tests: a GB200 decode-only spec and a plan of two cliques."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.topology.planner import InstanceSite, TopologyPlan

REPO = Path(__file__).resolve().parents[1]


def gb200_decode_spec(mode: str = "operator") -> MoEDeploymentSpec:
    """Two decode instances of 4 GB200 nodes (EP16), no prefill."""
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
    obj["spec"].pop("prefill")
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"].update({"mode": mode, "redundantExperts": 16})
    return MoEDeploymentSpec.model_validate(obj["spec"])


TWO_CLIQUE_PLAN = TopologyPlan(
    sites=tuple(
        InstanceSite(
            "decode",
            i,
            "nvlink",
            "nvidia.com/gpu.clique",
            f"clique-{i}",
            tuple(f"n{i}-{r}" for r in range(4)),
        )
        for i in range(2)
    ),
    waiting=(),
)
