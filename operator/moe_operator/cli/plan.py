"""`moe-operator plan -f SPEC.yaml [--nodes NODES.yaml]`: the topology plan without a cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml


def register(subparsers: Any) -> None:
    from moe_operator.cli.policy import add_policy_args

    p = subparsers.add_parser(
        "plan",
        help="print where every engine instance of a MoEDeployment would run (no cluster needed)",
        description=(
            "Plans NVLink domains, racks and nodes for every instance of the spec's pools. NODES is "
            "either a node pools file (the sandbox format) or a Node list (kubectl get nodes -o yaml); "
            "default: the sandbox's shipped pools."
        ),
    )
    p.add_argument("-f", "--filename", type=Path, required=True, help="MoEDeployment YAML")
    p.add_argument("--nodes", type=Path, default=None, help="node pools file or Node list YAML")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    add_policy_args(p)
    p.set_defaults(func=_plan)


def load_nodes(path: Path | None) -> list[dict[str, Any]]:
    from moe_operator.topology import nodepools

    if path is None:
        objs = nodepools.render_nodes(nodepools.load())
    else:
        raw = yaml.safe_load(path.read_text())
        if isinstance(raw, dict) and "pools" in raw:
            objs = nodepools.render_nodes(nodepools.NodePoolsFile.model_validate(raw))
        elif isinstance(raw, dict) and raw.get("kind") in ("List", "NodeList"):
            objs = list(raw["items"])
        else:
            raise SystemExit(f"{path}: neither a node pools file (pools:) nor a Node list (kind: List)")
    for o in objs:
        status = o.setdefault("status", {})
        if not status.get("conditions"):
            status["conditions"] = [{"type": "Ready", "status": "True"}]  # a file has no live conditions
    return objs


def _plan(args: argparse.Namespace) -> int:
    from moe_operator.cli.policy import admit
    from moe_operator.topology.planner import plan_topology
    from moe_operator.topology.requests import pool_requests, topology_policy
    from moe_operator.topology.snapshot import node_from_object

    doc = yaml.safe_load(args.filename.read_text())
    raw_spec = doc.get("spec", doc)
    namespace = str(args.namespace or (doc.get("metadata") or {}).get("namespace") or "default")
    spec, code = admit(args, raw_spec, namespace)
    if spec is None:
        return code
    nodes = [node_from_object(o) for o in load_nodes(args.nodes)]
    plan = plan_topology(pool_requests(spec), nodes, topology_policy(spec))
    if args.output == "json":
        print(
            json.dumps(
                {
                    "placements": [
                        {
                            "pool": p.pool,
                            "instance": p.index,
                            "kind": p.kind,
                            "domain": p.domain,
                            "nodes": list(p.nodes),
                        }
                        for p in plan.sites
                    ],
                    "waiting": [
                        {"pool": w.pool, "instance": w.index, "message": w.message} for w in plan.waiting
                    ],
                },
                indent=2,
            )
        )
    else:
        for p in plan.sites:
            print(
                f"{p.pool:8} {p.index:3}  {p.kind:6} {p.domain:20} {len(p.nodes):3} nodes: {', '.join(p.nodes)}"
            )
        for w in plan.waiting:
            print(f"{w.pool:8} {w.index:3}  WAITING  {w.message}")
    return 0 if not plan.waiting else 3
