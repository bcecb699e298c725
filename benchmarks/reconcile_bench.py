"""Reconciler benchmark on the sandbox: apply -> children and apply -> Ready for 1, 10, 50 deployments.

Runs its own sandbox (236 simulated GPU nodes: 200 H100 in racks of 20, plus 2 GB200 NVL72
cliques) and the real operator as a subprocess, and prints per round: p50/p99 seconds from
create to the last of its children (every object the operator renders, seen through watches so
measuring adds no polling load), to its first engine pod (split into: create -> the operator's
first write ("react"), -> its StatefulSet ("write"), -> the StatefulSet controller's pod ("pod")),
and to Ready; API requests the operator
sent per deployment while creating (and while idle); the operator's resident memory. Beside each
burst (--lws, the default), the same burst as one-group LeaderWorkerSets carrying the pod template
the operator renders, handled by the real LeaderWorkerSet controller on the same sandbox, right
after: create -> first pod for both, and the ratio. Usage:

    .venv/bin/python benchmarks/reconcile_bench.py [--rounds 1,10,50] [--paced 50@2,50@4] [--concurrency 8,1]
        [--no-lws]

--rounds are bursts: all deployments created back to back, as fast as the API server admits
them. --paced rounds create N deployments at R per second, the latency when the cluster keeps
up; on a 2-core machine the burst of 50 is bound by CPU shared with the API server, and the
paced rounds show where that starts. Each round runs once per operator --apply-concurrency
value (default 8, then 1 as the baseline: applies one by one), on the same sandbox, and ratios
are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from moe_operator.api import build_crd
from moe_operator.api import keys as K
from moe_sandbox import leaderworkerset as lws
from moe_sandbox import toolchain
from moe_sandbox.cluster import Ports, Sandbox, server_side_apply

REPO = Path(__file__).resolve().parents[1]
NODES = """
pools:
  - {name: h100, count: 200, nodesPerRack: 20, gpusPerNode: 8, gpuProduct: NVIDIA-H100-80GB-HBM3, gpuMemoryMiB: 81559}
  - {name: gb200, domains: 2, nodesPerDomain: 18, gpusPerNode: 4, gpuProduct: NVIDIA-GB200, gpuMemoryMiB: 189471}
"""
MOED = "/apis/moe.inference.dev/v1alpha1"
WARMUP = 3  # deployments (and sets) created once before measuring: both controllers start warm
LWS_PATH = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets"


def spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    obj["metadata"] = {"name": name}
    obj["spec"]["model"].pop("volume", None)
    obj["spec"]["model"].pop("path", None)
    obj["spec"]["router"] = {"replicas": 1}
    # explicit, so that installing LeaderWorkerSet for the comparison changes nothing here
    obj["spec"]["topology"]["groupBackend"] = "StatefulSet"
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            out[name] = float("nan")
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


# Every kind of child the operator renders; watched (not polled) so measuring adds no load.
CHILD_COLLECTIONS = (
    "/api/v1/namespaces/{ns}/configmaps",
    "/api/v1/namespaces/{ns}/services",
    "/api/v1/namespaces/{ns}/secrets",
    "/api/v1/namespaces/{ns}/serviceaccounts",
    "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
)
PODS = "/api/v1/namespaces/{ns}/pods"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


class Watcher(threading.Thread):
    """Records when each object of one collection is first seen (children) or turns Ready."""

    def __init__(
        self,
        box: Sandbox,
        path: str,
        seen: dict[tuple[str, str], float],
        ready: dict[str, float],
        pods: dict[str, float] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.box, self.path, self.seen, self.ready = box, path, seen, ready
        self.pods = pods if pods is not None else {}
        self.stop = threading.Event()
        self.started_watch = threading.Event()

    def run(self) -> None:
        try:
            self.watch()
        except httpx.HTTPError:
            if not self.stop.is_set():
                raise

    def watch(self) -> None:
        with self.box.client(timeout=None) as api:  # type: ignore[arg-type]
            rv = api.get(self.path).json()["metadata"]["resourceVersion"]
            params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "false"}
            with api.stream("GET", self.path, params=params) as resp:
                self.started_watch.set()
                for line in resp.iter_lines():
                    if self.stop.is_set():
                        return
                    if line:
                        self.record(json.loads(line)["object"], time.monotonic())

    def record(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if obj.get("kind") == "Pod":  # the first engine pod of a deployment (or of a LeaderWorkerSet)
            owner = labels.get(LWS_NAME) or (labels.get(K.DEPLOYMENT) if K.POOL in labels else None)
            if owner:
                self.pods.setdefault(owner, now)
            return
        if obj.get("kind") == "MoEDeployment":
            conds = (obj.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                self.ready.setdefault(meta["name"], now)
            return
        owner = labels.get(K.DEPLOYMENT)
        if owner:
            self.seen.setdefault((owner, f"{obj.get('kind')}/{meta['name']}"), now)


def run_round(
    box: Sandbox,
    api: httpx.Client,
    n: int,
    metrics_port: int,
    pid: int,
    ns: str,
    rate: float = 0.0,
    idle: bool = True,
) -> dict[str, Any]:
    """n deployments created back to back (rate 0: a burst, as fast as the API server admits
    them) or at `rate` per second; latencies are from each deployment's own create."""
    api.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
    while api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code != 200:
        time.sleep(0.1)
    seen: dict[tuple[str, str], float] = {}
    ready: dict[str, float] = {}
    first_pod: dict[str, float] = {}
    watchers = [Watcher(box, p.format(ns=ns), seen, ready) for p in CHILD_COLLECTIONS]
    watchers.append(Watcher(box, f"{MOED}/namespaces/{ns}/moedeployments", seen, ready))
    watchers.append(Watcher(box, PODS.format(ns=ns), seen, ready, first_pod))
    for w in watchers:
        w.start()
        w.started_watch.wait(30)
    before = operator_requests(metrics_port)
    pids = {name: pid for name, pid in box.running().items() if pid is not None}
    pids["operator"] = pid
    cpu_before, wall_before = cpu_of(pids), time.monotonic()
    created: dict[str, float] = {}
    first = time.monotonic()
    for i in range(n):
        name = f"m{i:03d}"
        if rate:
            time.sleep(max(0.0, first + i / rate - time.monotonic()))
        resp = api.post(f"{MOED}/namespaces/{ns}/moedeployments", json=spec(name))
        resp.raise_for_status()
        created[name] = time.monotonic()
    arrival = (n - 1) / (created[f"m{n - 1:03d}"] - first) if n > 1 else float("nan")
    deadline = time.monotonic() + 300
    while len(ready) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    create_requests = operator_requests(metrics_port) - before
    cpu_after, wall = cpu_of(pids), time.monotonic() - wall_before
    # Where the CPU went between the first create and the last Ready (2 cores in all here).
    cpu_share = {name: (cpu_after[name] - cpu_before[name]) / wall for name in pids}
    idle_requests = float("nan")
    if idle:
        time.sleep(15)
        idle_before = operator_requests(metrics_port)
        time.sleep(30)
        idle_requests = operator_requests(metrics_port) - idle_before
    memory = rss_mb(pid)
    for w in watchers:
        w.stop.set()
    # Children of a deployment are all created when the last of them (as counted once it is
    # Ready, when the operator has applied everything) was first seen.
    last_child: dict[str, float] = {}
    counts: dict[str, int] = {}
    for (owner, _), t in seen.items():
        last_child[owner] = max(last_child.get(owner, 0.0), t)
        counts[owner] = counts.get(owner, 0) + 1
    to_children = [last_child[k] - created[k] for k in last_child]
    to_ready = [ready[k] - created[k] for k in ready]
    to_pod = [first_pod[k] - created[k] for k in first_pod if k in created]
    # where the time to the first pod goes: until the operator's first write, until the
    # StatefulSet is written, until the StatefulSet controller created the pod
    first_write: dict[str, float] = {}
    workload: dict[str, float] = {}
    for (owner, child), t in seen.items():
        first_write[owner] = min(first_write.get(owner, t), t)
        if child.startswith("StatefulSet/"):
            workload[owner] = min(workload.get(owner, t), t)
    stages = {
        "react": [first_write[k] - created[k] for k in first_write if k in created],
        "write": [workload[k] - first_write[k] for k in workload if k in first_write],
        "pod": [first_pod[k] - workload[k] for k in first_pod if k in workload],
    }
    # A StatefulSet changed after creation means an instance was re-planned (and restarted).
    replanned = sum(
        1
        for sts in api.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets").json()["items"]
        if sts["metadata"].get("generation", 1) > 1
    )
    # Wait for the namespace (and everything in it) to be gone: the garbage collection of one
    # round must not load the next one's measurement.
    api.delete(f"/api/v1/namespaces/{ns}")
    deadline = time.monotonic() + 300
    while api.get(f"/api/v1/namespaces/{ns}").status_code != 404 and time.monotonic() < deadline:
        time.sleep(1)
    return {
        "arrival": arrival,
        "replanned": replanned,
        "cpu": cpu_share,
        "n": n,
        "children": statistics.median(counts.values()),
        "children_p50": statistics.median(to_children),
        "children_p99": pct(to_children, 0.99),
        "ready_p50": statistics.median(to_ready) if to_ready else float("nan"),
        "ready_p99": pct(to_ready, 0.99) if to_ready else float("nan"),
        "ready": len(ready),
        "stages": {k: (statistics.median(v), pct(v, 0.99)) for k, v in stages.items() if v},
        "pod_p50": statistics.median(to_pod) if to_pod else float("nan"),
        "pod_p99": pct(to_pod, 0.99) if to_pod else float("nan"),
        "requests_per_deployment": create_requests / n,
        "idle_requests": idle_requests,
        "rss_mb": memory,
    }


def leaderworkerset_template() -> dict[str, Any]:
    """The LeaderWorkerSet the operator renders for the example (groupBackend LeaderWorkerSet): the
    same pod template, so both controllers create the same pods. What only the operator creates
    (its ServiceAccount, owner) is dropped; the pod runs as the namespace's default account."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(json.dumps(spec("lws")))
        f.flush()
        out = subprocess.run(
            [sys.executable, "-m", "moe_operator.cli", "render", "-f", f.name,
             "--group-backend", "LeaderWorkerSet", "-o", "json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    obj: dict[str, Any] = next(o for o in json.loads(out.stdout)["items"] if o["kind"] == "LeaderWorkerSet")
    obj["metadata"] = {}
    for template in (
        obj["spec"]["leaderWorkerTemplate"].get(k) for k in ("leaderTemplate", "workerTemplate")
    ):
        if template:
            template["spec"].pop("serviceAccountName", None)
    return obj


def run_lws_round(
    box: Sandbox, api: httpx.Client, n: int, ns: str, template: dict[str, Any]
) -> dict[str, Any]:
    """n one-group LeaderWorkerSets created back to back; create -> first pod, per set."""
    api.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
    while api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code != 200:
        time.sleep(0.1)
    first_pod: dict[str, float] = {}
    watcher = Watcher(box, PODS.format(ns=ns), {}, {}, first_pod)
    watcher.start()
    watcher.started_watch.wait(30)
    created: dict[str, float] = {}
    first = time.monotonic()
    for i in range(n):
        obj = json.loads(json.dumps(template))
        obj["metadata"] = {"name": f"m{i:03d}"}
        api.post(f"{LWS_PATH.format(ns=ns)}", json=obj).raise_for_status()
        created[obj["metadata"]["name"]] = time.monotonic()
    deadline = time.monotonic() + 300
    while len(first_pod) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    watcher.stop.set()
    to_pod = [first_pod[k] - created[k] for k in first_pod if k in created]
    api.delete(f"/api/v1/namespaces/{ns}")
    deadline = time.monotonic() + 300
    while api.get(f"/api/v1/namespaces/{ns}").status_code != 404 and time.monotonic() < deadline:
        time.sleep(1)
    return {
        "n": n,
        "arrival": (n - 1) / (created[f"m{n - 1:03d}"] - first) if n > 1 else float("nan"),
        "pods": len(to_pod),
        "pod_p50": statistics.median(to_pod) if to_pod else float("nan"),
        "pod_p99": pct(to_pod, 0.99) if to_pod else float("nan"),
    }


def print_lws(r: dict[str, Any], ours: dict[str, Any]) -> None:
    missing = "" if r["pods"] == r["n"] else f"  (only {r['pods']} of {r['n']} sets made a pod)"
    print(
        f"{'LWS':>4} {r['n']:>4} {r['arrival']:>9.1f} {'':>8} {'':>13} {'':>7} {r['pod_p50']:>7.2f}s "
        f"{r['pod_p99']:>6.2f}s   (operator / LWS: p50 {ours['pod_p50'] / r['pod_p50']:.2f}x, "
        f"p99 {ours['pod_p99'] / r['pod_p99']:.2f}x){missing}",
        flush=True,
    )


def start_operator(box: Sandbox, work: Path, port_base: int, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(box.kubeconfig)}
    log = open(work / f"operator-{concurrency}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "moe_operator.cli", "run", "--metrics-port", str(port_base + 1100),
         "--liveness", f"http://127.0.0.1:{port_base + 1080}/healthz",
         "--webhook-port", str(port_base + 1443), "--apply-concurrency", str(concurrency)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port_base + 1080}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.3)
    time.sleep(3)
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", default="1,10,50")
    parser.add_argument(
        "--concurrency",
        default="8,1",
        help="operator --apply-concurrency values to run side by side (the last one is the baseline)",
    )
    parser.add_argument(
        "--paced",
        default="50@2,50@4",
        help="extra rounds N@R: N deployments created at R per second (latency when the cluster keeps up)",
    )
    parser.add_argument("--port-base", type=int, default=25000)
    parser.add_argument(
        "--lws",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="right after each burst of the first --concurrency, the same burst as one-group "
        "LeaderWorkerSets (the pod template the operator renders) under the real LWS controller, on "
        "the same sandbox: create -> first pod side by side",
    )
    args = parser.parse_args()
    rounds = [(int(x), 0.0) for x in args.rounds.split(",")]
    rounds += [(int(x.split("@")[0]), float(x.split("@")[1])) for x in args.paced.split(",") if x]
    variants = [int(x) for x in args.concurrency.split(",")]

    work = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    nodes_file = work / "nodes.yaml"
    nodes_file.write_text(NODES)
    box = Sandbox(work / "sandbox", Ports(args.port_base))
    print(
        f"sandbox up in {box.up(nodes_file, log=lambda m: print(m, file=sys.stderr)):.1f}s", file=sys.stderr
    )
    results: dict[tuple[int, int, float], dict[str, Any]] = {}
    try:
        with box.client(timeout=30) as api:
            crd = build_crd()
            server_side_apply(
                api,
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                crd,
                "bench",
            )
            while api.get(f"{MOED}/moedeployments").status_code != 200:
                time.sleep(0.2)
            nodes = len(api.get("/api/v1/nodes").json()["items"])
            print(
                f"\nreconciler benchmark: {nodes} simulated GPU nodes, single-node Qwen3-30B-A3B deployments"
            )
            print(f"{'conc':>4} {'N':>4} {'arrival/s':>9} {'objects':>8} {'children p50':>13} {'p99':>7} "
                  f"{'pod p50':>8} {'p99':>7} {'Ready p50':>10} {'p99':>7} {'ready':>6} {'replanned':>9} "
                  f"{'req/deploy':>11} {'idle req/30s':>13} {'RSS MB':>7}")  # fmt: skip
            template = None
            if args.lws:
                seconds = lws.install(box, log=lambda m: print(m, file=sys.stderr))
                print(f"LeaderWorkerSet controller {toolchain.LWS_VERSION} installed in {seconds:.1f}s")
                template = leaderworkerset_template()
                run_lws_round(box, api, WARMUP, "bench-lws-warmup", template)
            lws_results: dict[int, dict[str, Any]] = {}
            for concurrency in variants:
                proc = start_operator(box, work, args.port_base, concurrency)
                try:
                    run_round(box, api, WARMUP, args.port_base + 1100, proc.pid, f"bench-c{concurrency}-warmup",
                              idle=False)  # fmt: skip
                    for n, rate in rounds:
                        ns = f"bench-c{concurrency}-{n}" + (f"-at-{rate:g}".replace(".", "-") if rate else "")
                        r = run_round(box, api, n, args.port_base + 1100, proc.pid, ns, rate)
                        results[(concurrency, n, rate)] = r
                        print(
                            f"{concurrency:>4} {n:>4} {r['arrival']:>9.1f} {r['children']:>8.0f} "
                            f"{r['children_p50']:>12.2f}s "
                            f"{r['children_p99']:>6.2f}s {r['pod_p50']:>7.2f}s {r['pod_p99']:>6.2f}s "
                            f"{r['ready_p50']:>9.2f}s {r['ready_p99']:>6.2f}s "
                            f"{int(r['ready']):>6} {int(r['replanned']):>9} {r['requests_per_deployment']:>11.1f} "
                            f"{r['idle_requests']:>13.0f} {r['rss_mb']:>7.1f}",
                            flush=True,
                        )
                        cpu = "  ".join(
                            f"{k} {v:.2f}" for k, v in sorted(r["cpu"].items(), key=lambda kv: -kv[1])
                        )
                        print(f"{'':>9} CPU cores used until all Ready: {cpu}", flush=True)
                        where = "  ".join(f"{k} {a:.2f}/{b:.2f}s" for k, (a, b) in r["stages"].items())
                        print(f"{'':>9} to the first pod, p50/p99: {where}", flush=True)
                        if template is not None and not rate and concurrency == variants[0]:
                            lws_results[n] = run_lws_round(box, api, n, f"bench-lws-{n}", template)
                            print_lws(lws_results[n], r)
                finally:
                    proc.terminate()
                    proc.wait(30)
            if len(variants) > 1:
                base = variants[-1]
                print(f"\nratios to --apply-concurrency {base} (same sandbox, same run; < 1 is faster):")
                for concurrency in variants[:-1]:
                    for n, rate in rounds:
                        a, b = results[(concurrency, n, rate)], results[(base, n, rate)]
                        at = f" at {rate:g}/s" if rate else " burst"
                        print(
                            f"  conc {concurrency} N={n:>3}{at}: children p99 {a['children_p99'] / b['children_p99']:.2f}x, "
                            f"Ready p99 {a['ready_p99'] / b['ready_p99']:.2f}x"
                        )
            if lws_results:
                print(f"\ncreate -> first pod, this operator (--apply-concurrency {variants[0]}) / the "
                      "LeaderWorkerSet controller, each burst right after the other on the same sandbox:")  # fmt: skip
                for n, r in lws_results.items():
                    ours = results[(variants[0], n, 0.0)]
                    print(
                        f"  N={n:>3}: p50 {ours['pod_p50'] / r['pod_p50']:.2f}x, p99 {ours['pod_p99'] / r['pod_p99']:.2f}x"
                    )
            print(
                "targets: children p99 < 1 s after apply; operator RSS < 300 MB with 50 deployments; "
                "create -> pod p99 at most 1.5x the LeaderWorkerSet controller's"
            )
    finally:
        box.down(log=lambda m: None, purge=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
