"""The topology planner's rules, on the sandbox's default node pools (no cluster needed)."""

from __future__ import annotations

from collections import Counter

from moe_operator.topology import nodepools
from moe_operator.topology.planner import InstanceSite, PoolRequest, TopologyPolicy, plan_topology
from moe_operator.topology.snapshot import NodeInfo, node_from_object

POLICY = TopologyPolicy()


def default_nodes(used: dict[str, int] | None = None) -> list[NodeInfo]:
    objs = nodepools.render_nodes(nodepools.load())
    for o in objs:
        o["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return [node_from_object(o, (used or {}).get(o["metadata"]["name"], 0)) for o in objs]


def h100_only(nodes: list[NodeInfo]) -> list[NodeInfo]:
    return [n for n in nodes if n.labels["nvidia.com/gpu.product"].startswith("NVIDIA-H100")]


def test_pd_on_h100_racks_whole_groups_spread_and_near() -> None:
    reqs = [
        PoolRequest("prefill", replicas=1, nodes_per_instance=4, gpus_per_node=8, tp_size=1),
        PoolRequest("decode", replicas=2, nodes_per_instance=8, gpus_per_node=8, tp_size=1),
    ]
    plan = plan_topology(reqs, h100_only(default_nodes()), POLICY)
    assert not plan.waiting
    decode = [p for p in plan.sites if p.pool == "decode"]
    assert {p.kind for p in plan.sites} == {"rack"}
    # each instance inside one rack, decode instances on different racks
    assert len({p.domain for p in decode}) == 2
    nodes = default_nodes()
    rack_of = {n.name: n.labels["topology.kubernetes.io/zone"] for n in nodes}
    for p in plan.sites:
        assert {rack_of[n] for n in p.nodes} == {p.domain}
        assert len(p.nodes) == (4 if p.pool == "prefill" else 8)
    all_nodes = [n for p in plan.sites for n in p.nodes]
    assert len(all_nodes) == len(set(all_nodes)), "a node was given to two instances"


def test_multi_node_nvlink_prefers_clique_and_tp_never_crosses_it() -> None:
    # GB200: 4 GPUs per node, TP 8 spans two nodes -> must be inside one clique.
    req = PoolRequest("decode", replicas=2, nodes_per_instance=18, gpus_per_node=4, tp_size=8)
    plan = plan_topology([req], default_nodes(), POLICY)
    assert not plan.waiting
    assert [p.kind for p in plan.sites] == ["nvlink", "nvlink"]
    assert len({p.domain for p in plan.sites}) == 2

    third = PoolRequest("decode", replicas=3, nodes_per_instance=18, gpus_per_node=4, tp_size=8)
    plan = plan_topology([third], default_nodes(), POLICY)
    assert len(plan.waiting) == 1
    w = plan.waiting[0]
    assert w.reason == "WaitingForCapacity"
    assert "decode instance 2 needs 18 nodes with 4 free GPUs in one NVLink domain" in w.message


def test_too_big_waits_with_actionable_message_then_fits_after_nodes_added() -> None:
    req = PoolRequest("decode", replicas=1, nodes_per_instance=17, gpus_per_node=8)
    nodes = h100_only(default_nodes())
    plan = plan_topology([req], nodes, POLICY)
    assert not plan.sites
    assert plan.waiting[0].message == (
        "decode instance 0 needs 17 nodes with 8 free GPUs in one NVLink domain or rack; "
        "the best rack, h100-rack-0, has 16"
    )
    extra = NodeInfo("h100-extra", {**nodes[0].labels, "kubernetes.io/hostname": "h100-extra"}, gpus=8)
    plan = plan_topology([req], [*nodes, extra], POLICY)
    assert not plan.waiting and plan.sites[0].domain == "h100-rack-0"


def test_stable_across_reconciles_and_moves_only_what_lost_capacity() -> None:
    reqs = [PoolRequest("decode", replicas=3, nodes_per_instance=4, gpus_per_node=8)]
    nodes = h100_only(default_nodes())
    first = plan_topology(reqs, nodes, POLICY)
    again = plan_topology(reqs, nodes, POLICY, previous=first.sites)
    assert again.sites == first.sites

    # Another tenant takes GPUs on one node of instance 1: only that node is replaced, same rack.
    victim = first.sites[1].nodes[0]
    busy = h100_only(default_nodes({victim: 8}))
    moved = plan_topology(reqs, busy, POLICY, previous=first.sites)
    assert moved.sites[0] == first.sites[0]
    assert moved.sites[2] == first.sites[2]
    assert moved.sites[1].domain == first.sites[1].domain
    assert victim not in moved.sites[1].nodes
    assert len(set(moved.sites[1].nodes) & set(first.sites[1].nodes)) == 3


def test_whole_rack_lost_moves_instance_to_another_rack() -> None:
    reqs = [PoolRequest("decode", replicas=1, nodes_per_instance=16, gpus_per_node=8)]
    nodes = h100_only(default_nodes())
    first = plan_topology(reqs, nodes, POLICY)
    gone = set(first.sites[0].nodes[:2])
    second = plan_topology(reqs, [n for n in nodes if n.name not in gone], POLICY, previous=first.sites)
    assert second.sites[0].domain != first.sites[0].domain


def test_never_half_a_group_under_fragmentation() -> None:
    # Every rack has 3 busy nodes: 13 free per rack; a 14-node instance must wait, taking nothing.
    nodes = h100_only(default_nodes())
    used: dict[str, int] = {}
    per_rack: Counter[str] = Counter()
    for n in nodes:
        rack = n.labels["topology.kubernetes.io/zone"]
        if per_rack[rack] < 3:
            used[n.name] = 8
            per_rack[rack] += 1
    reqs = [
        PoolRequest("decode", replicas=1, nodes_per_instance=14, gpus_per_node=8),
        PoolRequest("prefill", replicas=1, nodes_per_instance=13, gpus_per_node=8),
    ]
    plan = plan_topology(reqs, h100_only(default_nodes(used)), POLICY)
    assert [w.pool for w in plan.waiting] == ["decode"]
    assert [p.pool for p in plan.sites] == ["prefill"]


def test_single_node_instances_land_anywhere_with_free_gpus() -> None:
    req = PoolRequest("decode", replicas=3, nodes_per_instance=1, gpus_per_node=8)
    plan = plan_topology([req], h100_only(default_nodes()), POLICY)
    assert [p.kind for p in plan.sites] == ["node"] * 3
    assert len({p.nodes[0] for p in plan.sites}) == 3


def test_node_selector_is_respected() -> None:
    policy = TopologyPolicy(node_selector={"nvidia.com/gpu.product": "NVIDIA-GB200"})
    req = PoolRequest("decode", replicas=1, nodes_per_instance=2, gpus_per_node=4)
    plan = plan_topology([req], default_nodes(), policy)
    assert plan.sites[0].kind == "nvlink"


def test_a_width_change_plans_around_the_nodes_other_instances_still_run() -> None:
    """Wider instances are rolled one at a time: each is planned onto nodes the pool's other
    instances do not run on, as long as any fit (else onto them, and they all restart at once)."""
    nodes = h100_only(default_nodes())
    narrow = plan_topology(
        [PoolRequest("decode", replicas=4, nodes_per_instance=2, gpus_per_node=8)], nodes, POLICY
    )
    wide = [PoolRequest("decode", replicas=4, nodes_per_instance=4, gpus_per_node=8)]
    plan = plan_topology(wide, nodes, POLICY, previous=narrow.sites)
    assert not plan.waiting
    for site in plan.sites:
        others = {n for old in narrow.sites if old.index != site.index for n in old.nodes}
        assert not others & set(site.nodes), (site, narrow.sites)
    # 32 nodes: four 2-node instances run on 8; four 4-node ones fit on the other 24 only in part
    tight = [PoolRequest("decode", replicas=4, nodes_per_instance=7, gpus_per_node=8)]
    packed = plan_topology(tight, nodes, POLICY, previous=narrow.sites)
    assert not packed.waiting  # every instance placed, some onto nodes the narrow ones still run
    used = {n for s in packed.sites for n in s.nodes}
    assert used & {n for s in narrow.sites for n in s.nodes}


def test_a_wider_instance_starts_from_its_own_nodes_and_keeps_its_nvlink_domain() -> None:
    """Two 2-node instances in one 8-node NVLink domain widen to 4: each takes its own nodes and two
    free ones (so neither waits on the other), and not a rack beside the domain."""

    def node(name: str, clique: str | None) -> NodeInfo:
        labels = {
            "topology.kubernetes.io/zone": "z1",
            **({"nvidia.com/gpu.clique": clique} if clique else {}),
        }
        return NodeInfo(name, labels, gpus=8)

    nodes = [node(f"n{i}", "c1") for i in range(8)] + [node(f"r{i}", None) for i in range(6)]
    before = [InstanceSite("decode", 0, "nvlink", "nvidia.com/gpu.clique", "c1", ("n4", "n5")),
              InstanceSite("decode", 1, "nvlink", "nvidia.com/gpu.clique", "c1", ("n6", "n7"))]  # fmt: skip
    plan = plan_topology([PoolRequest("decode", 2, 4, 8)], nodes, POLICY, before)
    assert [s.kind for s in plan.sites] == ["nvlink", "nvlink"]
    assert {"n4", "n5"} <= set(plan.sites[0].nodes) and {"n6", "n7"} <= set(plan.sites[1].nodes)
    assert not set(plan.sites[0].nodes) & set(plan.sites[1].nodes)
