"""Node pools: a small declarative file expanded into Node objects (pure).

The format `moe-operator plan` and `render` read to plan offline, and the one the sandbox
expands into simulated (kwok) GPU nodes; the shipped default is the sandbox's pools.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from moe_operator.api import keys as K

CLIQUE_LABEL = "nvidia.com/gpu.clique"
POOL_LABEL = K.NODE_POOL
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


class NodePool(BaseModel):
    """One pool of identical simulated GPU nodes."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    count: int | None = Field(default=None, ge=1, description="Nodes in racks of nodesPerRack")
    nodes_per_rack: int = Field(default=8, ge=1, alias="nodesPerRack")
    domains: int | None = Field(default=None, ge=1, description="Multi-node NVLink domains")
    nodes_per_domain: int | None = Field(default=None, ge=1, alias="nodesPerDomain")
    rack_prefix: str | None = Field(default=None, alias="rackPrefix")
    gpus_per_node: int = Field(ge=1, alias="gpusPerNode")
    gpu_product: str = Field(alias="gpuProduct")
    gpu_memory_mib: int = Field(ge=1, alias="gpuMemoryMiB")
    cpu: str = "64"
    memory: str = "512Gi"
    ephemeral_storage: str = Field(
        default="4Ti", alias="ephemeralStorage", description="node-local disk (a kubelet's capacity)"
    )
    labels: dict[str, str] = Field(default_factory=dict)
    extra_resources: dict[str, str] = Field(
        default_factory=dict, alias="extraResources", description="e.g. a simulated RDMA device plugin"
    )

    @model_validator(mode="after")
    def _one_shape(self) -> NodePool:
        if (self.count is None) == (self.domains is None):
            raise ValueError(f"pool {self.name}: set exactly one of count or domains")
        if self.domains is not None and self.nodes_per_domain is None:
            raise ValueError(f"pool {self.name}: domains needs nodesPerDomain")
        return self

    @property
    def size(self) -> int:
        if self.count is not None:
            return self.count
        assert self.domains is not None and self.nodes_per_domain is not None
        return self.domains * self.nodes_per_domain


class NodePoolsFile(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    rack_label: str = Field(default="topology.kubernetes.io/zone", alias="rackLabel")
    pod_cidr_base: str = Field(default="127.16.0.0/12", alias="podCIDRBase")
    node_ip_base: str = Field(default="127.1.0.0/16", alias="nodeIPBase")
    pools: list[NodePool]


def load(path: Path | None = None) -> NodePoolsFile:
    """Read a node pools file; None means the default one shipped with the package."""
    if path is None:
        text = resources.files("moe_operator.topology").joinpath("data/nodepools.yaml").read_text()
    else:
        text = Path(path).read_text()
    return NodePoolsFile.model_validate(yaml.safe_load(text))


def _pod_cidrs(base: str, count: int) -> list[str]:
    """One /24 per node inside 127.0.0.0/8, so kwok hands out loopback pod IPs local processes can bind."""
    net = ipaddress.ip_network(base)
    loopback = ipaddress.ip_network("127.0.0.0/8")
    if not net.subnet_of(loopback):  # type: ignore[arg-type]
        raise ValueError(f"podCIDRBase {base} must lie inside 127.0.0.0/8")
    subnets = net.subnets(new_prefix=24)
    cidrs = []
    for _ in range(count):
        try:
            cidrs.append(str(next(subnets)))
        except StopIteration:
            raise ValueError(f"podCIDRBase {base} has room for fewer than {count} /24s") from None
    return cidrs


def _node_ips(base: str, count: int) -> Iterator[str]:
    net = ipaddress.ip_network(base)
    if not net.subnet_of(ipaddress.ip_network("127.0.0.0/8")):  # type: ignore[arg-type]
        raise ValueError(f"nodeIPBase {base} must lie inside 127.0.0.0/8")
    hosts = net.hosts()
    for _ in range(count):
        yield str(next(hosts))


def render_nodes(spec: NodePoolsFile) -> list[dict[str, Any]]:
    """Node objects (with status capacity) for every pool, in a stable order."""
    total = sum(p.size for p in spec.pools)
    cidrs = iter(_pod_cidrs(spec.pod_cidr_base, total))
    node_ips = _node_ips(spec.node_ip_base, total)
    nodes: list[dict[str, Any]] = []
    for pool in spec.pools:
        prefix = pool.rack_prefix or f"{pool.name}-rack"
        for i in range(pool.size):
            labels = {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                POOL_LABEL: pool.name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(pool.gpus_per_node),
                "nvidia.com/gpu.product": pool.gpu_product,
                "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
                **pool.labels,
            }
            if pool.domains is not None:
                assert pool.nodes_per_domain is not None
                domain = i // pool.nodes_per_domain
                rack = f"{prefix}-{domain}"
                labels[CLIQUE_LABEL] = f"{pool.name}-nvl.{domain}"
                name = f"{pool.name}-d{domain}-n{i % pool.nodes_per_domain:02d}"
            else:
                rack = f"{prefix}-{i // pool.nodes_per_rack}"
                name = f"{pool.name}-{i:03d}"
            labels[spec.rack_label] = rack
            labels["kubernetes.io/hostname"] = name
            resources_ = {
                "cpu": pool.cpu,
                "memory": pool.memory,
                "ephemeral-storage": pool.ephemeral_storage,
                "pods": "110",
                "nvidia.com/gpu": str(pool.gpus_per_node),
                **pool.extra_resources,
            }
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": labels,
                        "annotations": {KWOK_ANNOTATION: "fake"},
                    },
                    "spec": {"podCIDR": next(cidrs)},
                    "status": {
                        "capacity": resources_,
                        "allocatable": dict(resources_),
                        # Loopback node IPs: hostNetwork pods (RDMA) get one local processes can bind.
                        "addresses": [
                            {"type": "InternalIP", "address": next(node_ips)},
                            {"type": "Hostname", "address": name},
                        ],
                    },
                }
            )
    return nodes
