"""The MoEDeployment API: pydantic models of spec and status, the CRD built from them, conditions.

The models are the single source of truth: crds/ and the docs/api.md reference are
generated from them (``moe-operator crds generate``) and a test fails when they drift.
"""

from .conditions import (
    CONDITION_TYPES,
    DEGRADED,
    PROGRESSING,
    READY,
    Reason,
    get_condition,
    is_true,
    set_condition,
)
from .crd import PRINTER_COLUMNS, SCALE_SUBRESOURCE, build_crd, openapi_schema, spec_schema, status_schema
from .model_spec import AttentionArchitecture, ModelArchitecture, ModelSpec
from .names import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, SHORT_NAMES, VERSION
from .spec import (
    DecodePoolSpec,
    EngineSpec,
    EPLBSpec,
    KVTransferSpec,
    MoEDeploymentSpec,
    MonitoringSpec,
    PoolSpec,
    PrefillPoolSpec,
    RouterSpec,
)
from .status import (
    Condition,
    MoEDeploymentStatus,
    PlacementsStatus,
    PlacementStatus,
    PoolsStatus,
    PoolStatus,
    RouterStatus,
)
from .topology_spec import TopologySpec

__all__ = [
    "API_VERSION",
    "CONDITION_TYPES",
    "CRD_NAME",
    "DEGRADED",
    "GROUP",
    "KIND",
    "PLURAL",
    "PRINTER_COLUMNS",
    "PROGRESSING",
    "READY",
    "SCALE_SUBRESOURCE",
    "SHORT_NAMES",
    "VERSION",
    "AttentionArchitecture",
    "Condition",
    "DecodePoolSpec",
    "EPLBSpec",
    "EngineSpec",
    "KVTransferSpec",
    "MoEDeploymentSpec",
    "MoEDeploymentStatus",
    "ModelArchitecture",
    "ModelSpec",
    "MonitoringSpec",
    "PlacementStatus",
    "PlacementsStatus",
    "PoolSpec",
    "PoolStatus",
    "PoolsStatus",
    "PrefillPoolSpec",
    "Reason",
    "RouterSpec",
    "RouterStatus",
    "TopologySpec",
    "build_crd",
    "get_condition",
    "is_true",
    "openapi_schema",
    "set_condition",
    "spec_schema",
    "status_schema",
]
