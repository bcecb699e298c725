"""spec.topology: what the nodes look like (or which hardware profile describes them) and where a pod
group may be placed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..hardware import known_profile, lookup_profile
from .base import APIObject, cel, rules
from .types import EmbeddedObject, LabelKey, LabelValue, Quantity, ResourceName

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery


def _no_crd_default(extra: dict[str, Any] | None = None) -> Any:
    """Schema hook: the CRD gets no default for this field, so a spec that leaves it out stays without
    it and spec.topology.hardware can supply it (the Python default applies when neither does)."""

    def hook(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update(extra or {})

    return hook


PROFILE_FIELDS = {
    "gpusPerNode": "gpus_per_node",
    "gpuMemory": "gpu_memory",
    "nvlinkDomainSize": "nvlink_domain_size",
    "hostNetwork": "host_network",
    "rdmaResourceName": "rdma_resource_name",
}
"""Topology fields a hardware profile fills in when the spec leaves them out (wire name -> profile field)."""


class TopologySpec(APIObject):
    """What the nodes look like and where a pod group may be placed."""

    model_config = rules(
        cel(
            "!has(self.nvlinkDomainSize) || !has(self.gpusPerNode) || self.nvlinkDomainSize % self.gpusPerNode == 0",
            "spec.topology.nvlinkDomainSize must be a whole number of nodes: set it to a multiple of spec.topology.gpusPerNode",
            ".nvlinkDomainSize",
        )
    )

    hardware: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Hardware profile of the nodes (h100-ib, h100-roce, h200-ib, h200-roce, b200-ib, "
        "gb200-nvl72, or one the platform adds): fills in gpusPerNode, gpuMemory, nvlinkDomainSize, "
        "hostNetwork, rdmaResourceName and the GPU nodeSelector where the spec leaves them out, and "
        "gives the recipe its fabric facts (environment, two-batch overlap, DeepEP limits, batch per "
        "rank). docs/recipes.md lists each profile and the source of every value. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "spec.topology.hardware is immutable: every pod group is shaped by it; create a new "
                    "MoEDeployment for other hardware",
                )
            ]
        },
    )
    gpus_per_node: int = Field(
        default=8,
        ge=1,
        le=16,
        description="GPUs of each node, all given to the one engine pod that runs there (8 on "
        "H100/H200/B200 nodes, 4 on GB200 trays). An instance's GPU world, and so its EP size, is "
        "nodesPerReplica x gpusPerNode. Immutable: every group's shape depends on it. At most 16, the "
        "most GPUs any node has. Default: the hardware profile's, else 8.",
        json_schema_extra=_no_crd_default(
            {
                "x-kubernetes-validations": [
                    cel(
                        "self == oldSelf",
                        "spec.topology.gpusPerNode is immutable: every pod group is shaped by it; "
                        "create a new MoEDeployment for other nodes",
                    )
                ]
            }
        ),
    )
    gpu_memory: Quantity = Field(
        default="80Gi",
        description="Memory of one GPU, a Kubernetes quantity (80Gi for H100, 141Gi for H200, 184Gi "
        "for GB200). Admission checks that each instance's weights plus a minimal KV cache fit. "
        "Default: the hardware profile's, else 80Gi.",
        json_schema_extra=_no_crd_default(),
    )
    gpu_resource_name: ResourceName = Field(
        default="nvidia.com/gpu", description="Extended resource name the engine pods request GPUs by."
    )
    nvlink_domain_label: LabelKey = Field(
        default="nvidia.com/gpu.clique",
        description="Node label whose value names the node's NVLink domain (set by the NVIDIA GPU "
        "operator on multi-node NVLink systems such as GB200 NVL72). Nodes without the label are "
        "each their own domain. A pod group is placed inside one domain when one has room for it.",
    )
    nvlink_domain_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GPUs joined by NVLink in one domain: 72 for GB200 NVL72 racks. Unset means one "
        "node (gpusPerNode). Attention tensor parallelism must fit inside one domain. At most 1024, "
        "above the largest NVLink domain built (576 GPUs).",
    )
    rack_label: LabelKey = Field(
        default="topology.kubernetes.io/zone",
        description="Node label grouping nodes that share a fast network (rack, spine block or zone). "
        "When no NVLink domain can hold a group, the group stays inside one value of this label.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Labels a node must have to run engine pods (in addition to the operator's own "
        "NVLink-domain pinning).",
    )
    tolerations: list[EmbeddedObject] = Field(
        default_factory=list,
        max_length=32,
        description="Kubernetes tolerations of the engine pods, for example for tainted GPU nodes.",
    )
    group_backend: Literal["auto", "StatefulSet", "LeaderWorkerSet"] = Field(
        default="auto",
        description="What runs one engine instance's pod group: StatefulSet (one per instance, with a "
        "headless Service; no extra controller) or LeaderWorkerSet (one per instance; needs the "
        "LeaderWorkerSet controller, leaderworkerset.x-k8s.io/v1). auto takes LeaderWorkerSet when "
        "the cluster serves it when the deployment is first reconciled, else StatefulSet, and keeps "
        "that choice (status.pools.*.groupBackend). Either way the operator restarts a failed group "
        "whole with backoff and rolls spec changes one instance at a time. Changing it on a running "
        "deployment replaces every instance at once.",
    )
    host_network: bool = Field(
        default=False,
        description="Run engine pods in the host network namespace, as many RDMA/RoCE setups need for "
        "DeepEP and KV transfer. Ports must then be free on the node. Default: the hardware "
        "profile's, else false.",
        json_schema_extra=_no_crd_default(),
    )
    rdma_resource_name: ResourceName | None = Field(
        default=None,
        description="Extended resource for RDMA NICs requested once per engine pod (for example rdma/ib "
        "or rdma/rdma_shared_device_a); unset requests none (or the hardware profile's).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_from_hardware(cls, data: Any) -> Any:
        """Fields the spec leaves out come from its hardware profile (an unknown name is left to the
        field's own check, which names the known ones)."""
        name = data.get("hardware") if isinstance(data, dict) else None
        if not isinstance(name, str) or not known_profile(name):
            return data
        profile = lookup_profile(name)
        filled = dict(data)
        for wire, attr in PROFILE_FIELDS.items():
            if wire not in filled and attr not in filled:
                value = getattr(profile, attr)
                if value is not None:
                    filled[wire] = value
        if not filled.get("nodeSelector") and not filled.get("node_selector"):
            filled["nodeSelector"] = {GPU_PRODUCT_LABEL: profile.gpu_product}
        return filled

    @field_validator("hardware")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is not None:
            lookup_profile(name)  # a ValueError naming the known profiles
        return name

    @model_validator(mode="after")
    def _as_the_profile_says(self) -> TopologySpec:
        """A written gpusPerNode that contradicts the profile would request GPUs no node has."""
        if self.hardware and known_profile(self.hardware):
            profile = lookup_profile(self.hardware)
            if self.gpus_per_node != profile.gpus_per_node:
                raise ValueError(
                    f"gpusPerNode {self.gpus_per_node} contradicts hardware {profile.name} "
                    f"({profile.gpus_per_node} GPUs per node): remove gpusPerNode"
                )
        return self
