"""`moe-operator render -f SPEC.yaml [--nodes NODES.yaml] [--namespace NS]`: every child object the
operator would create for a MoEDeployment, printed offline as a YAML stream (like `helm template`).

For GitOps previews, reviews and tests: the same admission rules as the webhook, the same
topology plan as `moe-operator plan` (against a nodes file or the sandbox's default node pools),
the same pure renderer as the reconciler. What only a cluster knows is stated instead of guessed:
the owner's uid (a stable stand-in derived from namespace and name), the runtime token (made at
the first reconcile), published placements (none yet), and whether LeaderWorkerSet is served
(`--group-backend`). The operator creates these objects itself; apply the MoEDeployment, not them.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from moe_operator.render.network import SelectorError
from moe_operator.render.network import add_flags as add_network_flags
from moe_operator.render.network import from_args as network_from_args


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (engine.json) as literal blocks, readable in a diff."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def register(subparsers: Any) -> None:
    from moe_operator.cli.policy import add_policy_args

    p = subparsers.add_parser(
        "render",
        help="print every child object the operator would create for a MoEDeployment (no cluster needed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-f", "--filename", type=Path, required=True, help="MoEDeployment YAML")
    p.add_argument("--nodes", type=Path, default=None, help="node pools file or Node list YAML")
    add_policy_args(p)
    p.add_argument(
        "--group-backend",
        choices=["StatefulSet", "LeaderWorkerSet"],
        default=None,
        help="what runs each instance's pod group; default: spec.topology.groupBackend, with auto "
        "taken as StatefulSet (what auto picks where LeaderWorkerSet is not served)",
    )
    p.add_argument(
        "--runtime-image",
        default=None,
        help="the operator's --runtime-image (default: the operator's default)",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.add_argument(
        "--compute-domain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="whether the cluster serves NVIDIA's ComputeDomain (resource.nvidia.com/v1beta1): "
        "hardware profiles with multi-node NVLink then get one per NVLink domain and their pods claim "
        "its IMEX channel (default: yes)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print every engine setting the recipe derives for each pool, with its rule and source, "
        "and the recipe's warnings, instead of the objects",
    )
    add_network_flags(p)  # the operator's --network-policy ... flags, with its defaults
    p.set_defaults(func=_render)


def compute_domain(spec: Any, args: argparse.Namespace) -> bool:
    from moe_operator.hardware import lookup_profile

    hardware = spec.topology.hardware
    return bool(args.compute_domain and hardware and lookup_profile(hardware).compute_domain)


def _render(args: argparse.Namespace) -> int:
    from moe_operator.cli.plan import load_nodes
    from moe_operator.cli.policy import admit
    from moe_operator.render.children import render_children
    from moe_operator.render.group import GroupBackend, Owner, RuntimeSettings
    from moe_operator.render.shared import token_secret
    from moe_operator.topology.planner import plan_topology
    from moe_operator.topology.requests import pool_requests, topology_policy
    from moe_operator.topology.snapshot import node_from_object

    doc = yaml.safe_load(args.filename.read_text())
    if not isinstance(doc, dict):
        print(f"{args.filename}: not a MoEDeployment", file=sys.stderr)
        return 1
    raw_spec = doc.get("spec", doc)
    metadata = doc.get("metadata") or {}
    name = str(metadata.get("name") or args.filename.stem)
    namespace = str(args.namespace or metadata.get("namespace") or "default")
    spec, code = admit(args, raw_spec, namespace)
    if spec is None:
        return code
    if args.explain:
        from moe_operator.recipe.explain import explain

        sys.stdout.write(explain(spec))
        return 0
    from moe_operator.validation import warnings

    for warning in warnings(raw_spec):
        print(f"warning: {warning}", file=sys.stderr)
    owner = Owner(
        name, namespace, str(uuid.uuid5(uuid.NAMESPACE_URL, f"moe.inference.dev/{namespace}/{name}"))
    )
    try:
        network = network_from_args(args)
    except SelectorError as exc:
        print(exc, file=sys.stderr)
        return 1
    settings = (
        RuntimeSettings(runtime_image=args.runtime_image, network=network)
        if args.runtime_image
        else RuntimeSettings(network=network)
    )
    wanted = args.group_backend or spec.topology.group_backend
    backend: GroupBackend = "LeaderWorkerSet" if wanted == "LeaderWorkerSet" else "StatefulSet"
    nodes = [node_from_object(o) for o in load_nodes(args.nodes)]
    plan = plan_topology(pool_requests(spec), nodes, topology_policy(spec))
    objects = [
        *render_children(spec, owner, plan, settings, None, backend, (), compute_domain(spec, args)),
        token_secret(owner, None),  # a preview never holds the real key
    ]
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    else:
        sys.stdout.write(
            yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=120)
        )
    for waiting in plan.waiting:
        print(
            f"{waiting.pool} instance {waiting.index} waits for capacity: {waiting.message}", file=sys.stderr
        )
    return 3 if plan.waiting else 0
