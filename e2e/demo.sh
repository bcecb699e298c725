#!/usr/bin/env bash
# The main job on the local simulated cluster, from a clean clone:
#   installs what is missing, starts the sandbox control plane (simulated H100 and GB200
#   pools), runs the operator, applies the DeepSeek-V3 P/D example and waits until the
#   operator reports it Ready, then shows where every engine instance landed.
# Clean up with: bash e2e/demo.sh down
set -euo pipefail
cd "$(dirname "$0")/.."
state=${MOE_SANDBOX_DIR:-$HOME/.cache/moe-operator/sandbox}
step() { printf '\n==> %s\n' "$*" >&2; }

if [ "${1:-}" = "down" ]; then
  [ -f "$state/operator.pid" ] && kill "$(cat "$state/operator.pid")" 2>/dev/null || true
  rm -f "$state/operator.pid"
  .venv/bin/moe-operator sandbox down
  exit 0
fi

bash e2e/setup.sh
step "starting the sandbox control plane"
.venv/bin/moe-operator sandbox up | tee "$state.up.log"
KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' "$state.up.log" | tail -1)
export KUBECONFIG
KUBECTL=$(ls -d "$HOME"/.cache/moe-operator/bin/kubernetes-*/ | grep -v partial | head -1)kubectl

step "installing the MoEDeployment CRD and starting the operator (log: $state/operator.log)"
"$KUBECTL" apply --server-side -f crds/ >/dev/null
"$KUBECTL" wait --for condition=established crd/moedeployments.moe.inference.dev --timeout=60s >/dev/null
if [ -f "$state/operator.pid" ] && kill -0 "$(cat "$state/operator.pid")" 2>/dev/null; then
  echo "operator already running (pid $(cat "$state/operator.pid"))"
else
  nohup .venv/bin/moe-operator run --liveness http://127.0.0.1:8080/healthz >"$state/operator.log" 2>&1 &
  echo $! >"$state/operator.pid"
  for _ in $(seq 60); do
    "$KUBECTL" get validatingwebhookconfiguration moe.inference.dev >/dev/null 2>&1 && break
    sleep 1
  done
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
"$KUBECTL" get events --field-selector involvedObject.kind=MoEDeployment | tail -5

printf '\nThe sandbox and operator keep running. Use them with:\n  export KUBECONFIG=%s\n  %s get moed,sts,pods\nClean up with:\n  bash e2e/demo.sh down\n' "$KUBECONFIG" "$KUBECTL"
