#!/usr/bin/env bash
# The main job on the local simulated cluster: installs what is missing, starts the sandbox
# control plane with simulated H100 and GB200 node pools, and shows what runs there.
# Clean up with: .venv/bin/moe-operator sandbox down
set -euo pipefail
cd "$(dirname "$0")/.."
bash e2e/setup.sh
printf '\n==> starting the sandbox control plane\n' >&2
.venv/bin/moe-operator sandbox up | tee /tmp/moe-demo-up.log
export KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' /tmp/moe-demo-up.log | tail -1)
KUBECTL=$(ls -d ~/.cache/moe-operator/bin/kubernetes-*/ | grep -v partial | head -1)kubectl
printf '\n==> GPU nodes by NVLink clique and rack\n' >&2
"$KUBECTL" get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.clique,topology.kubernetes.io/zone | head -12
echo "..."
printf '\nThe sandbox keeps running. Use it with:\n  export KUBECONFIG=%s\nStop it with:\n  .venv/bin/moe-operator sandbox down\n' "$KUBECONFIG"
