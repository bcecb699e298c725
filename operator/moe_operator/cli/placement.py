"""`moe-operator placement ...`: list a pool's kept placement versions, roll back, resume.

Talks to the cluster of KUBECONFIG (or the in-cluster service account) with the same client
as the operator; the pure parts are in control/rollback.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from moe_operator.api import keys as K
from moe_operator.api.names import API_VERSION

MOED = f"/apis/{API_VERSION}"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "placement",
        help="expert placement versions of a MoEDeployment pool: history, rollback, resume",
        description="Inspect and roll back the versioned placement ConfigMaps the control loop publishes.",
    )
    sub = p.add_subparsers(dest="placement_command", metavar="COMMAND", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("name", help="MoEDeployment name")
        q.add_argument("--pool", choices=["prefill", "decode"], required=True)
        q.add_argument("-n", "--namespace", default="default")
        q.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")

    h = sub.add_parser("history", help="list the kept versions (* marks the live one)")
    common(h)
    h.add_argument("-o", "--output", choices=["text", "json"], default="text")
    h.set_defaults(func=_history)

    r = sub.add_parser(
        "rollback",
        help="publish a kept version again, as a new version, and pause automatic placement",
        description=(
            "Publishes the chosen kept map as a NEW version (history stays append-only) with provenance "
            "'rollback of vN'. By default the live ConfigMap is annotated "
            "moe.inference.dev/placement-paused, so the control loop keeps measuring but publishes "
            "nothing until `moe-operator placement resume`. In operator mode the loop pushes the "
            "rolled-back map to the runtimes at its next refresh."
        ),
    )
    common(r)
    r.add_argument(
        "--to-version", type=int, default=None, help="default: the newest kept version before the live one"
    )
    r.add_argument(
        "--no-pause",
        action="store_true",
        help="do not pause; the loop then only waits spec.eplb.minInterval from the rollback",
    )
    r.set_defaults(func=_rollback)

    s = sub.add_parser("resume", help="clear the pause a rollback set; automatic placement continues")
    common(s)
    s.set_defaults(func=_resume)


def _kube(args: argparse.Namespace) -> Any:
    from moe_operator.handlers.kube import Kube

    return Kube(args.kubeconfig)


def _entries(kube: Any, args: argparse.Namespace) -> list[Any]:
    from moe_operator.control import rollback as rb

    selector = f"{K.DEPLOYMENT}={args.name},{K.POOL}={args.pool}"
    listing = kube.get(f"/api/v1/namespaces/{args.namespace}/configmaps", params={"labelSelector": selector})
    return rb.history(list((listing or {}).get("items") or []), args.name, args.pool)


def _history(args: argparse.Namespace) -> int:
    from moe_operator.control import rollback as rb

    entries = _entries(_kube(args), args)
    if args.output == "json":
        rows = [
            {"version": e.version, "generatedAt": e.generated_at, "live": e.live, "provenance": e.provenance}
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
        return 0
    if not entries:
        print(f"no placement versions kept for {args.namespace}/{args.name} pool {args.pool}")
        return 1
    for e in entries:
        print(rb.describe(e))
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from moe_operator.control import rollback as rb
    from moe_operator.render.group import Owner

    kube = _kube(args)
    moed = kube.get(f"{MOED}/namespaces/{args.namespace}/moedeployments/{args.name}")
    if moed is None:
        print(f"MoEDeployment {args.namespace}/{args.name} not found", file=sys.stderr)
        return 1
    entries = _entries(kube, args)
    try:
        target = rb.pick(entries, args.to_version)
    except ValueError as exc:
        print(f"cannot roll back: {exc}", file=sys.stderr)
        return 1
    owner = Owner(args.name, args.namespace, moed["metadata"]["uid"])
    objs, expired = rb.rollback(owner, args.pool, entries, target, datetime.now(UTC), pause=not args.no_pause)
    for obj in objs:
        kube.apply(obj)
    for old in expired:
        kube.delete("v1", "ConfigMap", args.namespace, f"{objs[1]['metadata']['name']}-v{old}")
    version = json.loads(objs[0]["data"][rb.PLACEMENT_KEY])["version"]
    paused = "; automatic placement paused until `moe-operator placement resume`" if not args.no_pause else ""
    print(f"{args.pool}: published v{version} (rollback of v{target.version}){paused}")
    return 0


def _resume(args: argparse.Namespace) -> int:
    from moe_operator.render.group import placement_config_name

    kube = _kube(args)
    path = f"/api/v1/namespaces/{args.namespace}/configmaps/{placement_config_name(args.name, args.pool)}"
    if kube.get(path) is None:
        print(
            f"no live placement ConfigMap for {args.namespace}/{args.name} pool {args.pool}", file=sys.stderr
        )
        return 1
    # The pause may be owned by the operator's apply; a merge patch removes it whoever owns it.
    kube.merge_patch(path, {"metadata": {"annotations": {K.PLACEMENT_PAUSED: None}}}, K.CLI_MANAGER)
    print(f"{args.pool}: automatic placement resumed")
    return 0
