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
    obj["spec"]["topology"]["rdmaResourceName"] = "rdma/ib"  # EP16 normal kernels on GB200 need RDMA
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 4, "attentionDataParallel": 16})
    obj["spec"]["eplb"].update({"mode": mode, "redundantExperts": 16})
    return MoEDeploymentSpec.model_validate(obj["spec"])


def clique_plan(nodes: int) -> TopologyPlan:
    """Two decode instances of ``nodes`` nodes, each in its own NVLink clique."""
    return TopologyPlan(
        sites=tuple(
            InstanceSite(
                "decode",
                i,
                "nvlink",
                "nvidia.com/gpu.clique",
                f"clique-{i}",
                tuple(f"n{i}-{r}" for r in range(nodes)),
            )
            for i in range(2)
        ),
        waiting=(),
    )


TWO_CLIQUE_PLAN = clique_plan(4)


def example_spec(name: str) -> MoEDeploymentSpec:
    """An example under examples/ (by file name) as a spec."""
    return MoEDeploymentSpec.model_validate(yaml.safe_load((REPO / "examples" / name).read_text())["spec"])


EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))


def example_children(name: str, settings: Any = None, backend: str = "StatefulSet") -> list[dict[str, Any]]:
    """Every child the reconciler renders for an example, planned on the sandbox's default node pools
    (as `moe-operator render` does), owned by m/inference."""
    from moe_operator.render.children import render_children
    from moe_operator.render.group import Owner, RuntimeSettings
    from moe_operator.topology import nodepools
    from moe_operator.topology.planner import plan_topology
    from moe_operator.topology.requests import pool_requests, topology_policy
    from moe_operator.topology.snapshot import node_from_object

    spec = example_spec(name)
    objects = nodepools.render_nodes(nodepools.load())
    for o in objects:
        o["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    plan = plan_topology(pool_requests(spec), [node_from_object(o) for o in objects], topology_policy(spec))
    assert not plan.waiting, plan.waiting
    owner = Owner("m", "inference", "uid-1")
    return render_children(spec, owner, plan, settings or RuntimeSettings(), None, backend)  # type: ignore[arg-type]
