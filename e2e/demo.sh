#!/usr/bin/env bash
# The main job on the local simulated cluster, from a clean clone:
#   installs what is missing, starts the sandbox control plane (simulated H100 and GB200
#   pools), runs the operator, applies the DeepSeek-V3 P/D example and waits until the
#   operator reports it Ready, shows where every engine instance landed, starts a replay
#   runtime on each instance leader's IP and a real Prometheus with the project's alert
#   rules, lets the imbalance alert fire on the trivial expert placement, lets the operator's
#   control loop rebalance until it resolves, raises the decode pool's offered load until
#   SGLang's latency histograms fire the TTFT and inter-token-latency alerts, scales a second
#   deployment's decode pool out on an ITL SLO breach and back in when the load falls (drained
#   first), and prints a summary.
# Clean up with: bash e2e/demo.sh down
# Two sandboxes coexist with different MOE_SANDBOX_PORT_BASE (default 16000) and MOE_SANDBOX_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
export MOE_SANDBOX_PORT_BASE=${MOE_SANDBOX_PORT_BASE:-16000}
step() { printf '\n==> [%3ss] %s\n' "$SECONDS" "$*" >&2; }
demo() { .venv/bin/python e2e/demo/demo.py "$@"; }
operator_running() { [ -f "$STATE/operator.pid" ] && kill -0 "$(cat "$STATE/operator.pid")" 2>/dev/null; }
start_operator() {
  # The example asks for host networking (RDMA, KV transfer); a platform grants it per namespace.
  # The autoscaler ticks every 5 s instead of 30 s, so the autoscaling step takes minutes, not ten.
  MOE_AUTOSCALE_INTERVAL_S=${MOE_AUTOSCALE_INTERVAL_S:-5} nohup .venv/bin/moe-operator run --liveness "$OPERATOR_LIVENESS" --metrics-port "$OPERATOR_METRICS_PORT" \
    --webhook-port "$WEBHOOK_PORT" --host-network-namespaces default >>"$STATE/operator.log" 2>&1 &
  echo $! >"$STATE/operator.pid"
  demo wait-operator
  echo "operator pid $(cat "$STATE/operator.pid"), metrics on :$OPERATOR_METRICS_PORT"
}
stop_operator() {
  if operator_running; then
    pid=$(cat "$STATE/operator.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/operator.pid"
}

if [ "${1:-}" = "down" ]; then
  [ -x .venv/bin/python ] || { echo "nothing to stop (no .venv)"; exit 0; }
  eval "$(demo env)"
  step "stopping the demo's replay runtimes and Prometheus"
  demo stop
  step "stopping the operator"
  stop_operator
  step "stopping the sandbox"
  .venv/bin/moe-sandbox down
  exit 0
fi

bash e2e/setup.sh
eval "$(demo env)"
mkdir -p "$STATE"
demo stop >/dev/null  # leftovers of an earlier run

step "starting the sandbox control plane (state: $STATE, ports from $MOE_SANDBOX_PORT_BASE)"
nodes=$(demo nodes-file "$STATE/demo-nodepools.yaml")
.venv/bin/moe-sandbox up ${nodes:+--nodes "$nodes"} | tee "$STATE/demo-up.log"
KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' "$STATE/demo-up.log" | tail -1)
export KUBECONFIG

step "installing the MoEDeployment CRD and starting the operator (log: $STATE/operator.log)"
"$KUBECTL" apply --server-side -f crds/ >/dev/null
# Polled, not `kubectl wait`: right after the apply the CRD may have no status.conditions yet,
# and kubectl wait then fails at once instead of waiting.
for _ in $(seq 120); do
  established=$("$KUBECTL" get crd moedeployments.moe.inference.dev \
    -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)
  [ "$established" = True ] && break
  sleep 0.5
done
[ "$established" = True ] || { echo "the MoEDeployment CRD was not established within 60 s" >&2; exit 1; }
operator_running || start_operator
if [ -n "$("$KUBECTL" delete moedeployment deepseek-v3 --ignore-not-found --wait -o name)" ]; then
  echo "deleted the MoEDeployment of an earlier run (the new one starts from placement version 0)"
fi

step "applying examples/deepseek-v3-pd-h100.yaml (prefill EP32 x1, decode EP72 x2 on H100 racks)"
"$KUBECTL" apply -f e2e/demo/models-volume.yaml >/dev/null
"$KUBECTL" apply -f examples/deepseek-v3-pd-h100.yaml
step "waiting for the operator to report Ready"
"$KUBECTL" wait --for condition=Ready moedeployment/deepseek-v3 --timeout=300s
"$KUBECTL" get moedeployments -o wide

step "where the engine instances landed (from the scheduler's bindings and node labels)"
"$KUBECTL" get pods,nodes -o json | .venv/bin/python -c '
import json, sys, collections
items = json.load(sys.stdin)["items"]
nodes = {i["metadata"]["name"]: i["metadata"]["labels"] for i in items if i["kind"] == "Node"}
groups = collections.defaultdict(list)
for p in items:
    lab = p["metadata"].get("labels", {})
    if p["kind"] == "Pod" and lab.get("moe.inference.dev/deployment") == "deepseek-v3" and "moe.inference.dev/instance" in lab:
        groups[(lab["moe.inference.dev/pool"], lab["moe.inference.dev/instance"])].append(p["spec"].get("nodeName"))
for (pool, inst), ns in sorted(groups.items()):
    racks = sorted({nodes[n]["topology.kubernetes.io/zone"] for n in ns if n in nodes})
    print(f"{pool:8} instance {inst}: {len(ns)} pods on {len(set(ns))} nodes, rack(s) {racks}")
'

step "starting a replay runtime (GPU-less engine + the real sidecar) on every instance leader's IP"
demo runtimes

step "starting Prometheus (Debian package) with the project's alert rules"
demo prometheus

step "waiting for MoEExpertImbalanceHigh to fire on the trivial placement (the example's control loop refreshes every 5m)"
demo wait-fired

step "letting the control loop act now: refreshInterval 15s for the demo"
demo rebalance
step "waiting for the operator to publish placements and the alert to resolve"
demo wait-resolved

step "load step: the decode instances' offered load from 2 to 16 requests/s each (about twice their capacity)"
demo load-step

step "autoscaling: a second deployment (Qwen3-30B-A3B, one node per instance) whose decode pool follows an ITL SLO"
demo autoscale

step "summary"
"$KUBECTL" get moedeployments,statefulsets -o wide
echo
"$KUBECTL" get pods -o wide -l apps.kubernetes.io/pod-index=0
echo "(instance leaders only: $("$KUBECTL" get pods --no-headers | wc -l) pods in all)"
uid=$("$KUBECTL" get moedeployment deepseek-v3 -o jsonpath='{.metadata.uid}')
"$KUBECTL" get events --field-selector "involvedObject.uid=$uid" --sort-by=.lastTimestamp | tail -6
echo
demo summary

printf '\nEverything keeps running. Use it with:\n  export KUBECONFIG=%s\n  %s get moed,sts,pods\n  %s   (Prometheus: alerts, moe_runtime_balancedness, sglang:time_to_first_token_seconds_bucket)\nClean up with:\n  bash e2e/demo.sh down\n' \
  "$KUBECONFIG" "$KUBECTL" "$PROMETHEUS_URL"
