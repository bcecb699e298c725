"""Prefill and decode in one NVLink domain when the KV cache can move over NVLink only."""

from __future__ import annotations

from moe_operator.topology.planner import PoolRequest, TopologyPolicy, plan_topology
from moe_operator.topology.snapshot import NodeInfo

CLIQUE = "nvidia.com/gpu.clique"


def _racks(sizes: dict[str, int]) -> list[NodeInfo]:
    """GB200 trays in cliques that share one zone (the zone cannot tell the racks apart)."""
    return [
        NodeInfo(f"{c}-{i:02d}", {CLIQUE: c, "topology.kubernetes.io/zone": "z"}, 4)
        for c, n in sizes.items()
        for i in range(n)
    ]


REQUESTS = [
    PoolRequest("decode", replicas=1, nodes_per_instance=12, gpus_per_node=4),
    PoolRequest("prefill", replicas=3, nodes_per_instance=2, gpus_per_node=4),
]


def test_every_instance_lands_in_the_decode_instances_clique() -> None:
    plan = plan_topology(REQUESTS, _racks({"a": 18, "b": 18}), TopologyPolicy(colocate_pools=True))
    assert not plan.waiting
    assert {s.domain for s in plan.sites} == {"a"}


def test_without_room_there_an_instance_waits_instead_of_crossing_racks() -> None:
    plan = plan_topology(REQUESTS, _racks({"a": 16, "b": 18}), TopologyPolicy(colocate_pools=True))
    assert [(w.pool, w.index) for w in plan.waiting] == [("prefill", 2)]
    assert "NVLink domain of the other pool's instances" in plan.waiting[0].message
    spread = plan_topology(REQUESTS, _racks({"a": 16, "b": 18}), TopologyPolicy())
    assert not spread.waiting and {s.domain for s in spread.sites} == {"a", "b"}
