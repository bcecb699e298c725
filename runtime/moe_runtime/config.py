"""Loading the engine config in the pod, and the per-pod facts from environment variables.

The config's model is the operator/runtime contract (``moe_contract.engine``); what differs
between the pods of one engine instance (rank, leader address, pod IP) comes from the
pod's environment (``PodEnv``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moe_contract import pod as P
from moe_contract.engine import EngineConfig, Role

DEFAULT_CONFIG_PATH = P.DEFAULT_CONFIG_PATH
DEFAULT_TOKEN_FILE = P.DEFAULT_TOKEN_PATH
DEFAULT_PLACEMENT_FILE = P.DEFAULT_PLACEMENT_PATH


class ConfigError(ValueError):
    """An engine configuration that cannot run; the message names the field to fix."""


# ---------------------------------------------------------------- per-pod facts


class PodEnv(BaseModel):
    """Per-pod facts: who this pod is inside its engine instance."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(default=0, ge=0)
    nnodes: int | None = Field(default=None, ge=1)
    leader_address: str | None = None
    role: Role | None = None
    instance: str = ""
    pod_ip: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PodEnv:
        """MOE_* variables, with LeaderWorkerSet's LWS_* as fallbacks."""
        env = os.environ if env is None else env

        def first(*names: str) -> str | None:
            for name in names:
                value = env.get(name)
                if value not in (None, ""):
                    return value
            return None

        def as_int(name: str, value: str | None) -> int | None:
            if value is None:
                return None
            try:
                return int(value)
            except ValueError as exc:
                raise ConfigError(f"{name}={value!r} is not an integer") from exc

        try:
            return cls(
                rank=as_int("MOE_RANK", first(P.ENV_RANK, "LWS_WORKER_INDEX")) or 0,
                nnodes=as_int("MOE_NNODES", first(P.ENV_NNODES, "LWS_GROUP_SIZE")),
                leader_address=first(P.ENV_LEADER_ADDRESS, "LWS_LEADER_ADDRESS"),
                role=first(P.ENV_ROLE),  # type: ignore[arg-type]
                instance=first(P.ENV_INSTANCE) or "",
                pod_ip=first(P.ENV_POD_IP),
            )
        except ValidationError as exc:
            raise ConfigError(_format_validation(exc, "pod environment")) from exc


def pod_problems(cfg: EngineConfig, pod: PodEnv) -> list[str]:
    out = []
    nnodes = cfg.parallel.nnodes
    if pod.nnodes is not None and pod.nnodes != nnodes:
        out.append(f"MOE_NNODES={pod.nnodes} disagrees with parallel.nnodes={nnodes} in the engine config")
    if pod.rank >= nnodes:
        out.append(f"MOE_RANK={pod.rank} is out of range for nnodes={nnodes}")
    if nnodes > 1 and not pod.leader_address:
        out.append("MOE_LEADER_ADDRESS is required when nnodes > 1 (the rank-0 pod's DNS name)")
    if pod.role is not None and pod.role != cfg.role:
        out.append(f"MOE_ROLE={pod.role} disagrees with role={cfg.role} in the engine config")
    return out


# ---------------------------------------------------------------- loading


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> EngineConfig:
    """Read and validate the engine config; raise ConfigError with a readable message."""
    env = os.environ if env is None else env
    where = Path(path or env.get(P.ENV_ENGINE_CONFIG) or DEFAULT_CONFIG_PATH)
    try:
        raw = json.loads(where.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read engine config {where}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"engine config {where} is not valid JSON: {exc}") from exc
    return parse_config(raw, str(where))


def parse_config(raw: object, where: str = "engine config") -> EngineConfig:
    try:
        return EngineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, where)) from exc


def _format_validation(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '(config)'}: {msg}")
    return f"invalid {where}:\n" + "\n".join(lines)
