"""What the operator renders into an engine pod and the runtime reads there: paths, ports, env.

Both sides import these names from here, so a rename cannot leave one side behind.
"""

from __future__ import annotations

from typing import Final

# The runtime's three listeners on every engine pod, one client each (runtime/README.md, "Ports"):
# - the API (load windows, status, placement pushes): every route needs the bearer token; the
#   operator's collector and pushes. Its port is EngineConfig.ports.sidecar (default SIDECAR_PORT).
# - the probes (GET /healthz, /readyz): no token, no body, nothing tenant-controlled; the kubelet.
# - the metrics (GET /metrics, the moe_runtime_* series): no token, read-only; Prometheus.
# SGLang's own /metrics (the sglang:* series) stays on the engine's HTTP port (`http`).
SIDECAR_PORT: Final = 9400
PROBE_PORT: Final = 9401
METRICS_PORT: Final = 9402
SIDECAR_PORT_NAME: Final = "runtime"
PROBE_PORT_NAME: Final = "probes"
METRICS_PORT_NAME: Final = "metrics"
LIVENESS_PATH: Final = "/healthz"  # 200 while the runtime's event loop runs
READINESS_PATH: Final = "/readyz"  # 200 while this pod's engine rank answers its health check
METRICS_PATH: Final = "/metrics"

# Where the init container copies the runtime tree; the engine container puts it on PYTHONPATH.
RUNTIME_DIR: Final = "/opt/moe-runtime"
ENGINE_CONFIG_DIR: Final = "/etc/moe/engine"
PLACEMENT_DIR: Final = "/etc/moe/placement"
TOKEN_DIR: Final = "/etc/moe/token"

ENGINE_CONFIG_FILE: Final = "engine.json"
PLACEMENT_FILE: Final = "placement.json"
TOKEN_FILE: Final = "token"

DEFAULT_CONFIG_PATH: Final = f"{ENGINE_CONFIG_DIR}/{ENGINE_CONFIG_FILE}"
DEFAULT_PLACEMENT_PATH: Final = f"{PLACEMENT_DIR}/{PLACEMENT_FILE}"
DEFAULT_TOKEN_PATH: Final = f"{TOKEN_DIR}/{TOKEN_FILE}"

# Per-pod facts the operator sets as environment variables.
ENV_ENGINE_CONFIG: Final = "MOE_ENGINE_CONFIG"
ENV_ROLE: Final = "MOE_ROLE"
ENV_INSTANCE: Final = "MOE_INSTANCE"
ENV_RANK: Final = "MOE_RANK"
ENV_NNODES: Final = "MOE_NNODES"
ENV_LEADER_ADDRESS: Final = "MOE_LEADER_ADDRESS"
ENV_POD_IP: Final = "POD_IP"
ENV_POD_NAME: Final = "POD_NAME"
# Optional overrides of the runtime's listener ports (tests; the pod template leaves them unset).
ENV_PROBE_PORT: Final = "MOE_RUNTIME_PROBE_PORT"
ENV_METRICS_PORT: Final = "MOE_RUNTIME_METRICS_PORT"
# Static mode: seconds between two dumps of SGLang's expert-distribution recorder (default 10).
ENV_RECORDER_INTERVAL: Final = "MOE_RUNTIME_RECORDER_INTERVAL_SECONDS"
