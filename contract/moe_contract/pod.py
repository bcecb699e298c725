"""What the operator renders into an engine pod and the runtime reads there: paths, ports, env.

Both sides import these names from here, so a rename cannot leave one side behind.
"""

from __future__ import annotations

from typing import Final

# The sidecar's HTTP port on every engine pod (probes, metrics, load windows, placement pushes).
SIDECAR_PORT: Final = 9400

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
