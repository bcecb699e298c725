"""Every child the operator renders for an example, as the reconciler would (the pure renderer over
the sandbox's default node pools), without the platform's admission limits: the security tests
look at what the renderer makes of a spec, whichever platform admits it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.cli.plan import load_nodes
from moe_operator.render.children import render_children
from moe_operator.render.group import Owner, RuntimeSettings
from moe_operator.render.shared import token_secret
from moe_operator.topology.planner import plan_topology
from moe_operator.topology.requests import pool_requests, topology_policy
from moe_operator.topology.snapshot import node_from_object

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))


def example_spec(example: str) -> MoEDeploymentSpec:
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    return MoEDeploymentSpec.model_validate(doc["spec"])


def rendered(example: str, namespace: str, name: str | None = None) -> list[dict[str, Any]]:
    """The example's children in ``namespace`` (and its token Secret, with a placeholder token)."""
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    spec = MoEDeploymentSpec.model_validate(doc["spec"])
    owner = Owner(name or doc["metadata"]["name"], namespace, str(uuid.uuid4()))
    nodes = [node_from_object(o) for o in load_nodes(None)]
    plan = plan_topology(pool_requests(spec), nodes, topology_policy(spec))
    assert not plan.waiting, plan.waiting
    return [*render_children(spec, owner, plan, RuntimeSettings()), token_secret(owner, bytes(32))]
