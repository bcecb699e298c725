"""What a MoEDeployment asks of the topology planner: pool requests and placement policy (pure)."""

from __future__ import annotations

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.derived import pool_layout, pools
from moe_operator.recipe import kv_needs_one_domain
from moe_operator.topology.planner import PoolRequest, TopologyPolicy


def pool_requests(spec: MoEDeploymentSpec) -> list[PoolRequest]:
    out = []
    for pool, p in pools(spec).items():
        layout = pool_layout(p, spec.topology)
        out.append(
            PoolRequest(
                pool=pool,
                replicas=p.replicas,
                nodes_per_instance=layout.nodes,
                gpus_per_node=layout.gpus_per_node,
                tp_size=layout.attention_tp,
            )
        )
    return out


def topology_policy(spec: MoEDeploymentSpec) -> TopologyPolicy:
    t = spec.topology
    return TopologyPolicy(
        nvlink_label=t.nvlink_domain_label,
        rack_label=t.rack_label,
        node_selector=dict(t.node_selector),
        colocate_pools=kv_needs_one_domain(spec),
    )
