"""Reconciler benchmark on the sandbox: apply -> children and apply -> Ready for 1, 10, 50 deployments.

Runs its own sandbox (236 simulated GPU nodes: 200 H100 in racks of 20, plus 2 GB200 NVL72
cliques) and the real operator as a subprocess, and prints per round: p50/p99 seconds from
create to all children, and to Ready; API requests the operator sent per deployment while
creating (and while idle); the operator's resident memory. Usage:

    .venv/bin/python benchmarks/reconcile_bench.py [--rounds 1,10,50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from moe_operator.api import build_crd
from moe_operator.sandbox.cluster import Ports, Sandbox

REPO = Path(__file__).resolve().parents[1]
NODES = """
pools:
  - {name: h100, count: 200, nodesPerRack: 20, gpusPerNode: 8, gpuProduct: NVIDIA-H100-80GB-HBM3, gpuMemoryMiB: 81559}
  - {name: gb200, domains: 2, nodesPerDomain: 18, gpusPerNode: 4, gpuProduct: NVIDIA-GB200, gpuMemoryMiB: 189471}
"""
MOED = "/apis/moe.inference.dev/v1alpha1"


def spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    obj["metadata"] = {"name": name}
    obj["spec"]["model"].pop("volume", None)
    obj["spec"]["model"].pop("path", None)
    obj["spec"]["router"] = {"replicas": 1}
    return obj


def operator_requests(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("moe_operator_api_requests_total{")
    )


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def run_round(api: httpx.Client, n: int, metrics_port: int, pid: int) -> dict[str, float]:
    ns = f"bench-{n}"
    api.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
    while api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code != 200:
        time.sleep(0.1)
    before = operator_requests(metrics_port)
    created: dict[str, float] = {}
    for i in range(n):
        name = f"m{i:03d}"
        resp = api.post(f"{MOED}/namespaces/{ns}/moedeployments", json=spec(name))
        resp.raise_for_status()
        created[name] = time.monotonic()
    children: dict[str, float] = {}
    ready: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while len(ready) < n and time.monotonic() < deadline:
        now = time.monotonic()
        for sts in api.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets").json()["items"]:
            owner = sts["metadata"]["labels"]["moe.inference.dev/deployment"]
            children.setdefault(owner, now)
        for obj in api.get(f"{MOED}/namespaces/{ns}/moedeployments").json()["items"]:
            conds = (obj.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                ready.setdefault(obj["metadata"]["name"], now)
        time.sleep(0.05)
    create_requests = operator_requests(metrics_port) - before
    time.sleep(15)
    idle_before = operator_requests(metrics_port)
    time.sleep(30)
    idle_requests = operator_requests(metrics_port) - idle_before
    memory = rss_mb(pid)
    to_children = [children[k] - created[k] for k in children]
    to_ready = [ready[k] - created[k] for k in ready]
    api.delete(f"/api/v1/namespaces/{ns}")
    return {
        "n": n,
        "children_p50": statistics.median(to_children),
        "children_p99": pct(to_children, 0.99),
        "ready_p50": statistics.median(to_ready) if to_ready else float("nan"),
        "ready_p99": pct(to_ready, 0.99) if to_ready else float("nan"),
        "ready": len(ready),
        "requests_per_deployment": create_requests / n,
        "idle_requests": idle_requests,
        "rss_mb": memory,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", default="1,10,50")
    parser.add_argument("--port-base", type=int, default=25000)
    args = parser.parse_args()
    rounds = [int(x) for x in args.rounds.split(",")]

    work = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    nodes_file = work / "nodes.yaml"
    nodes_file.write_text(NODES)
    box = Sandbox(work / "sandbox", Ports(args.port_base))
    print(
        f"sandbox up in {box.up(nodes_file, log=lambda m: print(m, file=sys.stderr)):.1f}s", file=sys.stderr
    )
    proc = None
    try:
        with box.client(timeout=30) as api:
            api.patch(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{build_crd()['metadata']['name']}",
                params={"fieldManager": "bench", "force": "true"},
                content=yaml.safe_dump(build_crd()),
                headers={"Content-Type": "application/apply-patch+yaml"},
            ).raise_for_status()
            while api.get(f"{MOED}/moedeployments").status_code != 200:
                time.sleep(0.2)
            metrics_port = args.port_base + 1100
            env = {**os.environ, "KUBECONFIG": str(box.kubeconfig)}
            log = open(work / "operator.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                [sys.executable, "-m", "moe_operator.cli", "run", "--metrics-port", str(metrics_port),
                 "--liveness", f"http://127.0.0.1:{args.port_base + 1080}/healthz",
                 "--webhook-port", str(args.port_base + 1443)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{args.port_base + 1080}/healthz", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.3)
            time.sleep(3)
            nodes = len(api.get("/api/v1/nodes").json()["items"])
            print(
                f"\nreconciler benchmark: {nodes} simulated GPU nodes, single-node Qwen3-30B-A3B deployments"
            )
            print(f"{'N':>4} {'children p50':>13} {'p99':>7} {'Ready p50':>10} {'p99':>7} {'ready':>6} "
                  f"{'req/deploy':>11} {'idle req/30s':>13} {'RSS MB':>7}")  # fmt: skip
            for n in rounds:
                r = run_round(api, n, metrics_port, proc.pid)
                print(
                    f"{n:>4} {r['children_p50']:>12.2f}s {r['children_p99']:>6.2f}s {r['ready_p50']:>9.2f}s "
                    f"{r['ready_p99']:>6.2f}s {int(r['ready']):>6} {r['requests_per_deployment']:>11.1f} "
                    f"{r['idle_requests']:>13.0f} {r['rss_mb']:>7.1f}",
                    flush=True,
                )
            print("targets: children p99 < 1 s after apply; operator RSS < 300 MB with 50 deployments")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        box.down(log=lambda m: None, purge=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
