"""`moe-sandbox up | down | status | build`: the development control plane (not part of the product)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from moe_operator.topology import nodepools
from moe_sandbox import leaderworkerset, toolchain
from moe_sandbox.cluster import Sandbox, SandboxError


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe-sandbox",
        description=(
            "A real kube-apiserver, etcd, controller-manager, scheduler and kwok (simulated GPU nodes), "
            "built from upstream sources and run as local processes. No GPUs and no kubelet: pods "
            "are bound by the real scheduler and marked Running by kwok with loopback IPs."
        ),
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="state directory (default: ~/.cache/moe-operator/sandbox)"
    )
    sub = parser.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)

    up = sub.add_parser("up", help="build (once) and start the sandbox; idempotent")
    up.add_argument("--nodes", type=Path, default=None, help="node pools file (default: the shipped one)")
    up.add_argument(
        "--leaderworkerset",
        action="store_true",
        help="also run the LeaderWorkerSet controller (built from sigs.k8s.io/lws) with its CRD and "
        "webhooks, for spec.topology.groupBackend; start the operator after it",
    )
    up.set_defaults(func=_up)

    down = sub.add_parser("down", help="stop every sandbox process")
    down.add_argument("--purge", action="store_true", help="also delete the state directory (PKI, logs)")
    down.set_defaults(func=_down)

    status = sub.add_parser("status", help="show processes and simulated nodes")
    status.set_defaults(func=_status)

    build = sub.add_parser("build", help="only build the pinned upstream binaries (cached by version)")
    build.set_defaults(func=_build)
    return parser


def _up(args: argparse.Namespace) -> int:
    box = Sandbox(args.dir)
    try:
        seconds = box.up(args.nodes, log=_log)
        if args.leaderworkerset:
            seconds += leaderworkerset.install(box, log=_log)
    except (SandboxError, toolchain.BuildError) as exc:
        _log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    _print_nodes(box)
    print(f"sandbox up in {seconds:.1f}s; logs in {box.dir / 'logs'}; stop with: moe-sandbox down")
    print(f"KUBECONFIG={box.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        Sandbox(args.dir).down(log=_log, purge=args.purge)
    except SandboxError as exc:
        _log(f"error: {exc}")
        return 1
    print("sandbox stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    box = Sandbox(args.dir)
    running = box.running()
    for name, pid in running.items():
        print(f"{name:24} {'running pid ' + str(pid) if pid else 'stopped'}")
    if all(running.values()):
        _print_nodes(box)
        print(f"KUBECONFIG={box.kubeconfig}")
        return 0
    return 1


def _build(_args: argparse.Namespace) -> int:
    try:
        toolchain.ensure_built(_log)
    except toolchain.BuildError as exc:
        _log(f"error: {exc}")
        return 1
    for comp in toolchain.COMPONENTS:
        print(f"{comp.module}@{comp.version}: {toolchain.bin_dir(comp)}")
    return 0


def _print_nodes(box: Sandbox) -> None:
    with box.client() as c:
        items = c.get("/api/v1/nodes").json()["items"]
    gpu_nodes = [n for n in items if int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0]
    cliques = Counter(
        n["metadata"]["labels"][nodepools.CLIQUE_LABEL]
        for n in gpu_nodes
        if nodepools.CLIQUE_LABEL in n["metadata"]["labels"]
    )
    gpus = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in gpu_nodes)
    products = Counter(n["metadata"]["labels"].get("nvidia.com/gpu.product", "?") for n in gpu_nodes)
    print(
        f"{len(gpu_nodes)} GPU nodes ({gpus} GPUs): " + ", ".join(f"{v} x {k}" for k, v in products.items())
    )
    print(
        f"{sum(cliques.values())} nodes in {len(cliques)} NVLink cliques: "
        + ", ".join(f"{k} ({v} nodes)" for k, v in sorted(cliques.items()))
    )


if __name__ == "__main__":
    sys.exit(main())
