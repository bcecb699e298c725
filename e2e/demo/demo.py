"""Steps of `bash e2e/demo.sh` after the operator reports Ready (run with the operator's venv).

    demo.py env                 shell assignments: state dir, kubectl, ports
    demo.py wait-operator       until the operator is live and its webhook registered
    demo.py nodes-file PATH     node pools with loopback IPs moved off the default sandbox's
    demo.py runtimes            one replay runtime per instance leader pod, on the pod's IP
    demo.py prometheus          a real Prometheus scraping them and the operator, alert rules loaded
    demo.py wait-fired          until the imbalance alert fires on the trivial placement
    demo.py rebalance           shorten spec.eplb's intervals so the control loop acts now
    demo.py wait-resolved       until every pool has a placement version and the alert resolved
    demo.py load-step           raise the decode runtimes' offered load until the latency alerts fire
    demo.py autoscale           a second deployment's decode pool scales out on an ITL breach and back in
    demo.py summary             versions, balancedness before/after, alerts fired and resolved
    demo.py stop                stop the runtimes and Prometheus (pid files in the state dir)

Everything lives under $MOE_SANDBOX_DIR/demo; ports derive from $MOE_SANDBOX_PORT_BASE.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import demo_procs as procs
import httpx
import numpy as np
import yaml
from demo_prometheus import RuntimeTarget, episodes, identity, scrape_config, shorten_for, vector_by

from moe_contract.auth import DIGESTS_FILE, KEY_FIELD, instance_token
from moe_operator.topology import nodepools
from moe_sandbox import toolchain
from moe_sandbox.cluster import Sandbox
from moe_sandbox.paths import state_dir

REPO = Path(__file__).resolve().parents[2]
ALERT = "MoEExpertImbalanceHigh"
LATENCY_ALERTS = ("MoETimeToFirstTokenHigh", "MoEInterTokenLatencyHigh")
TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"
THRESHOLD = 0.7  # the rule's knob (policies/prometheus/moe-alerts.rules.yaml)
DEFAULT_BASE = 16000
SIDECAR_PORT = 9400  # the runtime API (port `runtime`)
METRICS_PORT = 9402  # the runtime's metrics listener (port `metrics`)
INTERVAL_S = (
    5  # Prometheus scrape interval (and timeout) and rule evaluation: slack for a loaded 2-core machine
)
VERSION_ANNOTATION = "moe.inference.dev/placement-version"


def base() -> int:
    return int(os.environ.get("MOE_SANDBOX_PORT_BASE", str(DEFAULT_BASE)))


def prometheus_port() -> int:
    return base() + 90


def operator_metrics_port() -> int:
    return base() + 100


def demo_dir() -> Path:
    return state_dir().resolve() / "demo"


def say(msg: str) -> None:
    print(msg, flush=True)


def api() -> httpx.Client:
    return Sandbox().client(timeout=30)


def wait(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Poll until predicate() is truthy; an HTTP error (a busy Prometheus or sidecar) means not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = predicate()
        except (httpx.HTTPError, ValueError) as exc:
            say(f"  (retrying: {type(exc).__name__} {exc})")
            got = None
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")


def marks() -> dict[str, float]:
    f = demo_dir() / "marks.json"
    return json.loads(f.read_text()) if f.exists() else {}


def mark(name: str) -> None:
    m = marks()
    m[name] = time.time()
    (demo_dir() / "marks.json").write_text(json.dumps(m))


# ---- paths, ports, nodes -----------------------------------------------------------------


def cmd_env(args: argparse.Namespace) -> int:
    """Shell assignments for demo.sh: where this sandbox lives and the ports derived from its base."""
    values = {
        "STATE": str(state_dir().resolve()),
        "KUBECTL": str(toolchain.binary_path("kubectl")),
        "OPERATOR_LIVENESS": f"http://127.0.0.1:{base() + 80}/healthz",
        "OPERATOR_METRICS_PORT": str(operator_metrics_port()),
        "WEBHOOK_PORT": str(base() + 450),
        "PROMETHEUS_URL": prom_url(),
    }
    for k, v in values.items():
        print(f"{k}={shlex.quote(v)}")
    return 0


def cmd_wait_operator(args: argparse.Namespace) -> int:
    """Until the operator answers its liveness probe and its admission webhook is registered."""
    url = f"http://127.0.0.1:{base() + 80}/healthz"

    def up() -> bool:
        try:
            if httpx.get(url, timeout=2).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
        with api() as c:
            hook = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/moe.inference.dev"
            return c.get(hook).status_code == 200

    wait("the operator's liveness and webhook", up, args.timeout)
    return 0


def cmd_nodes_file(args: argparse.Namespace) -> int:
    """Same pools; node and pod IPs in 127.(100+k).0.0/16 for port base k*1000, so the leader
    runtimes of two sandboxes (both on port 9400) never collide. Prints nothing for the default base."""
    if base() == DEFAULT_BASE:
        return 0
    k = (base() // 1000) % 100
    spec = nodepools.load()
    doc = spec.model_dump(by_alias=True, exclude_none=True)
    doc.update(nodeIPBase=f"127.{100 + k}.0.0/17", podCIDRBase=f"127.{100 + k}.128.0/17")
    Path(args.path).write_text(yaml.safe_dump(doc, sort_keys=False))
    print(args.path)
    return 0


# ---- runtimes ----------------------------------------------------------------------------


def leaders(c: httpx.Client, ns: str, name: str) -> list[dict[str, Any]] | None:
    sel = f"moe.inference.dev/deployment={name},apps.kubernetes.io/pod-index=0"
    items = c.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": sel}).json()["items"]
    out = [p for p in items if p["metadata"]["labels"].get("moe.inference.dev/pool") in ("prefill", "decode")]
    return out if out and all(p["status"].get("podIP") for p in out) else None


def trivial_doc(cfg: dict[str, Any]) -> dict[str, Any]:
    """Version 0 = SGLang's boot map (slot p holds expert p % E), as a placement document."""
    layers, experts = int(cfg["model"]["numLayers"]), int(cfg["model"]["numExperts"])
    slots = experts + int(cfg["eplb"]["numRedundantExperts"])
    phy2log = np.tile(np.arange(slots) % experts, (layers, 1))
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"version": 0, "generatedAt": now, "physicalToLogicalMap": phy2log.tolist()}


def window_count(ip: str) -> float:
    try:
        text = httpx.get(f"http://{ip}:{METRICS_PORT}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("moe_runtime_windows_total "):
            return float(line.split()[1])
    return 0.0


def cmd_runtimes(args: argparse.Namespace) -> int:
    d = demo_dir()
    marker = str(d)
    (d / "marks.json").unlink(missing_ok=True)  # a new run
    with api() as c:
        pods = wait("leader pods with IPs", lambda: leaders(c, args.namespace, args.name), 60)
        # As an engine pod mounts it: the digests of the instances' tokens only. The key (the
        # operator's, to derive each instance's token) is kept for the load step's calls.
        secret = c.get(f"/api/v1/namespaces/{args.namespace}/secrets/{args.name}-runtime-token").json()
        (d / "token").mkdir(exist_ok=True)
        (d / "token" / DIGESTS_FILE).write_bytes(base64.b64decode(secret["data"][DIGESTS_FILE]))
        token = d / "token" / "token"  # absent: the runtime checks tokens against the digests beside it
        key = d / "runtime-key"
        key.write_bytes(base64.b64decode(secret["data"][KEY_FIELD]))
        key.chmod(0o600)
        targets: list[dict[str, Any]] = []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            meta, labels = pod["metadata"], pod["metadata"]["labels"]
            pool, pod_name, ip = labels["moe.inference.dev/pool"], meta["name"], pod["status"]["podIP"]
            cm = c.get(f"/api/v1/namespaces/{args.namespace}/configmaps/{args.name}-{pool}-engine").json()
            cfg = json.loads(cm["data"]["engine.json"])
            rdir = d / "runtimes" / pod_name
            shutil.rmtree(rdir, ignore_errors=True)
            rdir.mkdir(parents=True)
            (rdir / "engine.json").write_text(json.dumps(cfg))
            (rdir / "placement-v0.json").write_text(json.dumps(trivial_doc(cfg)))
            argv = [
                sys.executable, "-m", "moe_runtime.cli", "replay",
                "--host", ip, "--port", str(SIDECAR_PORT),
                "--engine-config", str(rdir / "engine.json"), "--state-dir", str(rdir / "state"),
                "--token-file", str(token), "--reads", "token",  # every API route needs it, as in a pod
                "--placement-file", str(rdir / "placement-v0.json"),
                "--planner", "off", "--instance", meta["name"].rsplit("-", 1)[0],
                "--rebalance-iterations", str(args.rebalance_iterations), "--request-rate", str(args.request_rate),
                "--pass-interval", str(args.pass_interval), "--poll-interval", "0.5",  # one seed: one model's routing
            ]  # fmt: skip
            pid = procs.start(f"replay-{pod_name}", argv, d / "pids", d / "runtimes" / f"{pod_name}.log")
            ep = int(cfg["parallel"]["attnDp"])
            slots = int(cfg["model"]["numExperts"]) + int(cfg["eplb"]["numRedundantExperts"])
            say(
                f"  {pool:8} {pod_name:24} {ip}:{SIDECAR_PORT}  EP{ep}, {slots} expert slots "
                f"({slots // ep}/GPU), pid {pid}"
            )
            targets.append({"namespace": args.namespace, "deployment": args.name, "pool": pool,
                            "pod": pod_name, "ip": ip, "metrics_port": METRICS_PORT,
                            "instance": meta["name"].rsplit("-", 1)[0],
                            "engine_port": int(cfg.get("ports", {}).get("http", 30000))})  # fmt: skip
    (d / "targets.json").write_text(json.dumps(targets, indent=1))
    say(
        f"  every runtime replays skewed synthetic routing (hot experts up to ~7x their fair share), "
        f"a load window every {args.rebalance_iterations} passes ({args.pass_interval}s apart); "
        "it starts pinned to the trivial placement (version 0, SGLang's boot map) until the operator "
        f"pushes one; each serves {args.request_rate:g} requests/s of offered load (SGLang's latency "
        "histograms on its engine port)"
    )

    def all_reporting() -> bool:
        alive = procs.running(d / "pids", marker)
        for t in targets:
            if f"replay-{t['pod']}" not in alive:
                raise SystemExit(f"demo: replay runtime of {t['pod']} exited; see {d / 'runtimes'}")
        return all(window_count(t["ip"]) >= 1 for t in targets)

    wait("a load window from every runtime", all_reporting, 90)
    mark("runtimes")
    say(f"  all {len(targets)} runtimes report load windows")
    return 0


# ---- Prometheus --------------------------------------------------------------------------


def prom_url() -> str:
    return f"http://127.0.0.1:{prometheus_port()}"


def prom_query(q: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": q}
    if at is not None:
        params["time"] = at
    body = httpx.get(f"{prom_url()}/api/v1/query", params=params, timeout=10).json()
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def prom_range(q: str, start: float, end: float) -> list[dict[str, Any]]:
    params: dict[str, str | float] = {"query": q, "start": start, "end": end, "step": INTERVAL_S}
    body = httpx.get(f"{prom_url()}/api/v1/query_range", params=params, timeout=20).json()
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def alerts() -> list[dict[str, Any]]:
    """Active (pending or firing) alerts; raises when Prometheus does not answer (not "none")."""
    body = httpx.get(f"{prom_url()}/api/v1/alerts", timeout=10).json()
    out: list[dict[str, Any]] = body["data"]["alerts"]
    return out


def cmd_prometheus(args: argparse.Namespace) -> int:
    d = demo_dir()
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        raise SystemExit("demo: no prometheus binary; run bash e2e/setup.sh (Debian package prometheus)")
    rules, changed = shorten_for(
        yaml.safe_load((REPO / "policies" / "prometheus" / "moe-alerts.rules.yaml").read_text()), args.for_
    )
    rules_file = d / "prometheus" / "moe-alerts.demo.rules.yaml"
    data = d / "prometheus" / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    rules_file.write_text(
        "# policies/prometheus/moe-alerts.rules.yaml with every `for:` shortened for the demo\n"
        + yaml.safe_dump(rules, sort_keys=False)
    )
    targets = [RuntimeTarget(**t) for t in json.loads((d / "targets.json").read_text())]
    config = scrape_config(targets, f"127.0.0.1:{operator_metrics_port()}", str(rules_file), INTERVAL_S)
    config_file = d / "prometheus" / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    promtool = shutil.which("promtool")
    if promtool:
        subprocess.run([promtool, "check", "config", str(config_file)], check=True, capture_output=True)
    say(
        f"  rules: the project's {len(changed)} alerts with `for:` shortened to {args.for_} for the demo "
        f"(shipped: 5m-15m), e.g. {changed[0] if changed else '-'}"
    )
    argv = [
        binary, f"--config.file={config_file}", f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{prometheus_port()}", "--storage.tsdb.retention.time=1d",
    ]  # fmt: skip
    pid = procs.start("prometheus", argv, d / "pids", d / "prometheus" / "prometheus.log")
    say(f"  Prometheus {prom_url()} (pid {pid}); config {config_file}")

    def ready() -> bool:
        if not procs.alive(pid, str(d)):
            raise SystemExit(f"demo: Prometheus exited; see {d / 'prometheus' / 'prometheus.log'}")
        try:
            body = httpx.get(f"{prom_url()}/api/v1/targets", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return False
        active = body["data"]["activeTargets"]
        return len(active) == 2 * len(targets) + 1 and all(t["health"] == "up" for t in active)

    wait("Prometheus up with every target scraped", ready, 90)
    say(
        f"  scraping {len(targets)} leader pods (SGLang's :{targets[0].engine_port}/metrics, the runtime's "
        f":{METRICS_PORT}/metrics) and the operator (:{operator_metrics_port()})"
    )
    return 0


def pool_balancedness(at: float | None = None, over: str = "15s") -> dict[str, float]:
    """Mean over each pool's runtimes of their balancedness averaged over the last ``over``."""
    return vector_by(
        prom_query(f"avg by (pool) (avg_over_time(moe_runtime_balancedness[{over}]))", at), "pool"
    )


def alert_states(name: str) -> dict[str, str]:
    return {
        str(a["labels"].get("pool", "")): str(a["state"])
        for a in alerts()
        if a["labels"]["alertname"] == name
    }


def fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(values.items())) or "-"


def cmd_wait_fired(args: argparse.Namespace) -> int:
    """Until the alert fires in some pool; a pool still pending then gets a few evaluations more."""
    last, first_fired = "", 0.0

    def fired() -> bool:
        nonlocal last, first_fired
        states = alert_states(ALERT)
        line = f"  runtime balancedness {fmt(pool_balancedness())}; {ALERT}: " + (
            ", ".join(f"{p} {s}" for p, s in sorted(states.items())) or "inactive"
        )
        if line != last:
            say(line)
            last = line
        if "firing" in states.values() and not first_fired:
            first_fired = time.monotonic()
        settled = "pending" not in states.values() or time.monotonic() - first_fired > 4 * INTERVAL_S
        return bool(first_fired) and settled

    wait(f"{ALERT} to fire", fired, args.timeout, interval=INTERVAL_S)
    mark("fired")
    return 0


# ---- the control loop --------------------------------------------------------------------


def cmd_rebalance(args: argparse.Namespace) -> int:
    patch = {"spec": {"eplb": {"refreshInterval": args.refresh, "minInterval": args.refresh}}}
    with api() as c:
        path = f"/apis/moe.inference.dev/v1alpha1/namespaces/{args.namespace}/moedeployments/{args.name}"
        resp = c.patch(path, json=patch, headers={"Content-Type": "application/merge-patch+json"})
        resp.raise_for_status()
    mark("rebalance")
    say(f"  spec.eplb.refreshInterval and minInterval set to {args.refresh} (the example ships 5m and 10m)")
    return 0


def placement_status(ns: str, name: str) -> dict[str, dict[str, Any]]:
    with api() as c:
        obj = c.get(f"/apis/moe.inference.dev/v1alpha1/namespaces/{ns}/moedeployments/{name}").json()
    out: dict[str, dict[str, Any]] = (obj.get("status") or {}).get("placement") or {}
    return out


def cmd_wait_resolved(args: argparse.Namespace) -> int:
    """Until every pool has a placement version and the alert is inactive everywhere.

    On timeout with every pool placed, it says which pools still alert and goes on to the
    summary (a pool whose best placement sits near the threshold may keep flapping).
    """
    pools = sorted({t["pool"] for t in json.loads((demo_dir() / "targets.json").read_text())})
    start, last = time.time(), ""
    versions: dict[str, int] = {}
    states: dict[str, str] = {}

    def done() -> bool:
        nonlocal last, versions, states
        status = placement_status(args.namespace, args.name)
        versions = {p: int((status.get(p) or {}).get("version") or 0) for p in pools}
        states = alert_states(ALERT)
        line = (
            "versions "
            + ", ".join(f"{p} v{v}" for p, v in versions.items())
            + f"; runtime balancedness {fmt(pool_balancedness())}; {ALERT}: "
            + (", ".join(f"{p} {s}" for p, s in sorted(states.items())) or "inactive")
        )
        if line != last:
            say(f"  t+{time.time() - start:3.0f}s {line}")
            last = line
        return all(v >= 1 for v in versions.values()) and not states

    try:
        wait(f"a placement for every pool and {ALERT} resolved", done, args.timeout, interval=INTERVAL_S)
    except SystemExit:
        if not versions or min(versions.values()) < 1:
            raise
        say(f"  after {args.timeout:.0f}s {ALERT} is still active for: {', '.join(sorted(states))}")
    mark("resolved")
    return 0


# ---- the load step ------------------------------------------------------------------------


def latency_p95(family: str, over: str = "1m", at: float | None = None) -> dict[str, float]:
    """p95 per pool from SGLang's histograms, as the latency alerts compute it (shorter window)."""
    q = f"histogram_quantile(0.95, sum by (pool, le) (rate({family}_bucket[{over}])))"
    return {k: v for k, v in vector_by(prom_query(q, at), "pool").items() if v == v}  # drop NaN


def set_load(targets: list[dict[str, Any]], rate: float) -> None:
    key = bytes.fromhex((demo_dir() / "runtime-key").read_text().strip())
    for t in targets:
        r = httpx.post(
            f"http://{t['ip']}:{SIDECAR_PORT}/v1/replay/load",
            json={"requestRate": rate},
            headers={"Authorization": f"Bearer {instance_token(key, t['instance'])}"},
            timeout=5,
        )
        r.raise_for_status()


def cmd_load_step(args: argparse.Namespace) -> int:
    """Raise the decode runtimes' offered load past their capacity until the latency alerts fire."""
    targets = [t for t in json.loads((demo_dir() / "targets.json").read_text()) if t["pool"] == args.pool]
    before = {"ttft": latency_p95(TTFT), "itl": latency_p95(ITL)}
    firing = {a: s for a in LATENCY_ALERTS if (s := alert_states(a).get(args.pool))}
    if firing:
        raise SystemExit(f"demo: latency alerts active before the load step: {firing}")
    say(
        f"  {args.pool} before: p95 TTFT {fmt(before['ttft'])} s, p95 ITL {fmt(before['itl'])} s "
        f"({LATENCY_ALERTS[0]} > 2 s, {LATENCY_ALERTS[1]} > 0.1 s)"
    )
    set_load(targets, args.rate)
    mark("load")
    say(f"  offered load on the {len(targets)} {args.pool} runtimes: {args.rate:g} requests/s each")
    last = ""

    def fired() -> bool:
        nonlocal last
        states = {a: alert_states(a).get(args.pool, "inactive") for a in LATENCY_ALERTS}
        line = f"  p95 TTFT {fmt(latency_p95(TTFT))} s, p95 ITL {fmt(latency_p95(ITL))} s; " + ", ".join(
            f"{a}: {s}" for a, s in states.items()
        )
        if line != last:
            say(line)
            last = line
        return all(s == "firing" for s in states.values())

    try:
        wait(
            f"{' and '.join(LATENCY_ALERTS)} to fire for {args.pool}",
            fired,
            args.timeout,
            interval=INTERVAL_S,
        )
        mark("latency-fired")
        after = {"ttft": latency_p95(TTFT), "itl": latency_p95(ITL)}
    finally:
        set_load(targets, args.baseline)  # back to normal; the alerts resolve over their 5m window
    (demo_dir() / "latency.json").write_text(json.dumps({"before": before, "fired": after}, indent=1))
    say(
        f"  offered load back to {args.baseline:g} requests/s (the alerts resolve once 5m of rate() forgets the step)"
    )
    return 0


# ---- summary -----------------------------------------------------------------------------


def first_last(q: str, start: float, end: float) -> tuple[dict[str, float], dict[str, float]]:
    """First and last sample per pool of a range query."""
    first, last = {}, {}
    for s in prom_range(q, start, end):
        pool = str(s["metric"].get("pool", ""))
        if s["values"]:
            first[pool], last[pool] = float(s["values"][0][1]), float(s["values"][-1][1])
    return first, last


def cmd_summary(args: argparse.Namespace) -> int:
    m, now = marks(), time.time()
    t0 = m.get("runtimes", now - 600)
    with api() as c:
        sel = f"moe.inference.dev/deployment={args.name}"
        cms = c.get(f"/api/v1/namespaces/{args.namespace}/configmaps", params={"labelSelector": sel}).json()
    status = placement_status(args.namespace, args.name)  # after the ConfigMaps: the operator writes it last
    placement_cms = sorted(
        (i["metadata"]["name"], int(i["metadata"]["annotations"][VERSION_ANNOTATION]))
        for i in cms["items"]
        if VERSION_ANNOTATION in (i["metadata"].get("annotations") or {})
    )
    say("Placement versions (status.placement and the placement ConfigMaps):")
    versions: dict[str, int] = {}
    for pool, st in sorted(status.items()):
        versions[pool] = int(st.get("version") or 0)
        say(
            f"  {pool:8} v{versions[pool]}  measured {st.get('measuredBalancedness')}  "
            f"predicted {st.get('predictedBalancedness')}  moved {st.get('movedExperts')}  "
            f"ConfigMap {st.get('configMap', '-')}"
        )
        say(f"           {st.get('message', '')}")
    for cm_name, v in placement_cms:
        say(f"  ConfigMap {cm_name}: version {v}")

    before_at = m.get("rebalance", now)
    before = pool_balancedness(before_at, "30s")
    after = pool_balancedness(None, "10s")
    measured_first, measured_last = first_last(
        'moe_operator_placement_balancedness{kind="measured"}', before_at, now
    )
    _, predicted = first_last('moe_operator_placement_balancedness{kind="predicted"}', before_at, now)
    say("Balancedness (mean/max GPU load, 1 = perfect; the alert threshold is 0.7):")
    say("  pool      runtimes before  runtimes after  operator measured first/last  operator predicted")
    for pool in sorted(set(before) | set(after)):
        say(
            f"  {pool:8}  {before.get(pool, float('nan')):15.3f}  {after.get(pool, float('nan')):14.3f}  "
            f"{measured_first.get(pool, float('nan')):13.3f} / {measured_last.get(pool, float('nan')):.3f}  "
            f"{predicted.get(pool, float('nan')):17.3f}"
        )
    say(
        "  (runtimes: mean over the pool's runtimes; before: the trivial placement, the 30s before the control"
    )
    say("   loop was let run; after: the last 10s. Operator: first and last evaluation, last prediction)")

    latency = (
        json.loads((demo_dir() / "latency.json").read_text())
        if (demo_dir() / "latency.json").exists()
        else {}
    )
    sglang_names = sorted(
        str(r["metric"]["__name__"]) for r in prom_query('count by (__name__) ({__name__=~"sglang:.+"})')
    )
    say(f"SGLang series in Prometheus (from the runtimes' engine ports): {len(sglang_names)} families")
    for name in sglang_names:
        if name.startswith((TTFT, ITL, "sglang:num_requests", "sglang:num_running")):
            say(f"  {name}")
    if latency:
        say(
            "Latency (p95 over 1m, from SGLang's histograms), before the load step and when the alerts fired:"
        )
        for kind, label in (("ttft", "time to first token"), ("itl", "inter-token latency")):
            say(f"  {label:20} {fmt(latency['before'][kind])} s -> {fmt(latency['fired'][kind])} s")
    firing_now = {
        (a["labels"]["alertname"], identity(a["labels"])) for a in alerts() if a["state"] == "firing"
    }
    # Steps aligned on now, so the last one sees an alert that started firing a moment ago.
    start = now - math.ceil((now - t0) / INTERVAL_S) * INTERVAL_S
    eps = episodes(prom_range('ALERTS{alertstate="firing"}', start, now), INTERVAL_S, firing_now)
    say("Alerts (Prometheus ALERTS series since the runtimes started; times from that moment):")
    for e in eps:
        where = e.label("pool") or e.label("deployment")
        end = f"resolved at +{e.last_seen - t0 + INTERVAL_S:.0f}s" if e.resolved else "still firing"
        say(f"  {e.alert:28} pool={where:8} fired at +{e.fired_at - t0:.0f}s, {end}")
    if not eps:
        say("  none fired")
    scaling = (
        json.loads((demo_dir() / "autoscaling.json").read_text())
        if (demo_dir() / "autoscaling.json").exists()
        else {}
    )
    if scaling:
        say("Autoscaling (qwen3-30b's decode pool, events in order):")
        for line in scaling["events"]:
            say(f"  {line}")
        say(f"  requests refused by any replay engine: {sum(scaling['dropped'].values())}")
    summary = {
        "versions": versions,
        "placementConfigMaps": dict(placement_cms),
        "balancedness": {"before": before, "after": after, "operatorMeasuredFirst": measured_first,
                         "operatorMeasuredLast": measured_last, "operatorPredicted": predicted},
        "alerts": [{"alert": e.alert, "pool": e.label("pool"), "firedAt": e.fired_at, "resolved": e.resolved}
                   for e in eps],
        "latency": latency,
        "sglangSeries": sglang_names,
        "autoscaling": scaling,
    }  # fmt: skip
    (demo_dir() / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


def cmd_autoscale(args: argparse.Namespace) -> int:
    import demo_autoscale  # imports this module's helpers

    return demo_autoscale.cmd_autoscale(args)


def cmd_stop(args: argparse.Namespace) -> int:
    d = demo_dir()
    stopped = procs.stop_all(d / "pids", str(d))
    say(f"  stopped {len(stopped)} demo process(es)" + (f": {', '.join(stopped)}" if stopped else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="demo.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--namespace", default="default")
    p.add_argument("--name", default="deepseek-v3")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("env").set_defaults(func=cmd_env)
    s = sub.add_parser("wait-operator")
    s.add_argument("--timeout", type=float, default=90)
    s.set_defaults(func=cmd_wait_operator)
    s = sub.add_parser("nodes-file")
    s.add_argument("path")
    s.set_defaults(func=cmd_nodes_file)
    s = sub.add_parser("runtimes")
    s.add_argument("--rebalance-iterations", type=int, default=10)
    s.add_argument("--request-rate", type=float, default=2.0, help="offered requests/s per runtime")
    s.add_argument("--pass-interval", type=float, default=0.5)
    s.set_defaults(func=cmd_runtimes)
    s = sub.add_parser("prometheus")
    s.add_argument("--for", dest="for_", default="10s")
    s.set_defaults(func=cmd_prometheus)
    s = sub.add_parser("wait-fired")
    s.add_argument("--timeout", type=float, default=120)
    s.set_defaults(func=cmd_wait_fired)
    s = sub.add_parser("rebalance")
    s.add_argument("--refresh", default="15s")
    s.set_defaults(func=cmd_rebalance)
    s = sub.add_parser("wait-resolved")
    s.add_argument("--timeout", type=float, default=180)
    s.set_defaults(func=cmd_wait_resolved)
    s = sub.add_parser("load-step")
    s.add_argument("--pool", default="decode")
    s.add_argument("--rate", type=float, default=16.0, help="requests/s per runtime (about 2x capacity)")
    s.add_argument("--baseline", type=float, default=2.0)
    s.add_argument("--timeout", type=float, default=150)
    s.set_defaults(func=cmd_load_step)
    s = sub.add_parser("autoscale")
    s.add_argument("--timeout", type=float, default=150, help="seconds for each step to happen")
    s.set_defaults(func=cmd_autoscale)
    sub.add_parser("summary").set_defaults(func=cmd_summary)
    sub.add_parser("stop").set_defaults(func=cmd_stop)
    args = p.parse_args(argv)
    demo_dir().mkdir(parents=True, exist_ok=True)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
