"""Choose an NVLink domain or rack, and its nodes, for every engine instance (pure).

Rules, in priority order:
1. never half a group: an instance gets all its nodes in one domain, or none and waits;
2. attention TP never crosses an NVLink domain: an instance whose TP group is larger than
   a node must sit inside one multi-node NVLink domain (e.g. a GB200 NVL72 clique);
3. stable: an instance keeps its nodes, or at least its domain, while they stay usable;
4. an EP group stays in one NVLink domain when one can hold it, else in one rack;
5. instances of a pool spread over domains (fault isolation);
6. prefill and decode prefer the same zone (KV transfer);
7. best fit (the domain left with the fewest spare nodes), then name, for determinism.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from moe_operator.topology.snapshot import NodeInfo

DomainKind = Literal["nvlink", "rack", "node"]


@dataclass(frozen=True)
class PoolRequest:
    """What one pool needs: `replicas` instances of `nodes_per_instance` whole nodes each."""

    pool: str
    replicas: int
    nodes_per_instance: int
    gpus_per_node: int
    tp_size: int = 1

    @property
    def needs_multi_node_nvlink(self) -> bool:
        return self.tp_size > self.gpus_per_node


@dataclass(frozen=True)
class TopologyPolicy:
    nvlink_label: str | None = "nvidia.com/gpu.clique"
    rack_label: str = "topology.kubernetes.io/zone"
    zone_label: str = "topology.kubernetes.io/zone"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    colocate_pools: bool = False  # the pools' instances share a domain (KV moves over NVLink only)


@dataclass(frozen=True)
class InstanceSite:
    """Where one instance runs: its NVLink domain (or rack, or node) and its nodes."""

    pool: str
    index: int
    kind: DomainKind
    label: str  # the node label that defines the domain ("kubernetes.io/hostname" for a node)
    domain: str
    nodes: tuple[str, ...]

    @property
    def key(self) -> tuple[str, int]:
        return (self.pool, self.index)


@dataclass(frozen=True)
class Waiting:
    pool: str
    index: int
    reason: str
    message: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.pool, self.index)


@dataclass(frozen=True)
class TopologyPlan:
    """Where every instance runs (sites), and which instances wait for capacity."""

    sites: tuple[InstanceSite, ...]
    waiting: tuple[Waiting, ...]

    def site(self, pool: str, index: int) -> InstanceSite | None:
        return next((p for p in self.sites if p.key == (pool, index)), None)


@dataclass
class _Domain:
    kind: DomainKind
    label: str
    name: str
    nodes: list[NodeInfo]


def _eligible(node: NodeInfo, policy: TopologyPolicy, gpus: int) -> bool:
    if not (node.ready and node.schedulable) or node.free_gpus < gpus:
        return False
    return all(node.labels.get(k) == v for k, v in policy.node_selector.items())


def _domains(nodes: Sequence[NodeInfo], policy: TopologyPolicy, req: PoolRequest) -> list[_Domain]:
    """Candidate domains for an instance of `req`, NVLink cliques first."""
    if req.nodes_per_instance == 1 and not req.needs_multi_node_nvlink:
        return [_Domain("node", "kubernetes.io/hostname", n.name, [n]) for n in nodes]
    cliques: dict[str, list[NodeInfo]] = defaultdict(list)
    racks: dict[str, list[NodeInfo]] = defaultdict(list)
    for n in nodes:
        if policy.nvlink_label and n.labels.get(policy.nvlink_label):
            cliques[n.labels[policy.nvlink_label]].append(n)
        if n.labels.get(policy.rack_label):
            racks[n.labels[policy.rack_label]].append(n)
    out = [_Domain("nvlink", policy.nvlink_label or "", k, v) for k, v in sorted(cliques.items())]
    if not req.needs_multi_node_nvlink:
        out += [_Domain("rack", policy.rack_label, k, v) for k, v in sorted(racks.items())]
    return out


def _zone(node_labels: Mapping[str, str], policy: TopologyPolicy) -> str | None:
    return node_labels.get(policy.zone_label)


def plan_topology(
    requests: Sequence[PoolRequest],
    nodes: Iterable[NodeInfo],
    policy: TopologyPolicy,
    previous: Iterable[InstanceSite] = (),
) -> TopologyPlan:
    """Place every instance of every pool, or say why it waits.

    `nodes` carry the GPUs used by pods of *other* owners; this deployment's own pods are not
    counted, since the instances being planned are the ones that hold them.
    """
    by_name = {n.name: n for n in sorted(nodes, key=lambda n: n.name)}
    taken: set[str] = set()
    prev = {p.key: p for p in previous}
    sites: dict[tuple[str, int], InstanceSite] = {}
    waiting: list[Waiting] = []
    reqs = {r.pool: r for r in requests}

    def usable(name: str, req: PoolRequest) -> bool:
        node = by_name.get(name)
        return node is not None and name not in taken and _eligible(node, policy, req.gpus_per_node)

    # Pass 1: keep what still works (rule 3), so a reconcile never moves a healthy instance.
    for req in requests:
        for index in range(req.replicas):
            old = prev.get((req.pool, index))
            if old is None or len(old.nodes) != req.nodes_per_instance:
                continue
            if req.needs_multi_node_nvlink and old.kind != "nvlink":
                continue
            keep = [n for n in old.nodes if usable(n, req)]
            if len(keep) < req.nodes_per_instance and old.kind != "node":
                spare = [
                    n.name
                    for n in by_name.values()
                    if n.labels.get(old.label) == old.domain and n.name not in keep and usable(n.name, req)
                ]
                keep += spare[: req.nodes_per_instance - len(keep)]
            if len(keep) == req.nodes_per_instance:
                taken.update(keep)
                sites[old.key] = InstanceSite(
                    req.pool, index, old.kind, old.label, old.domain, tuple(sorted(keep))
                )

    # Pass 2: place new (or displaced) instances, larger instances first (harder to fit); one whose
    # width changed on its own earlier nodes first. Nodes where other instances not kept still run (a width change
    # rolls them one at a time) are used only when no domain as good fits without them: a group
    # planned onto them could not start before those restart.
    order = sorted(requests, key=lambda r: (-r.nodes_per_instance * r.gpus_per_node, r.pool))
    still_running = {n for p in prev.values() if p.key not in sites for n in p.nodes}
    for req in order:
        for index in range(req.replicas):
            if (req.pool, index) in sites:
                continue
            before = prev.get((req.pool, index))
            own = frozenset(before.nodes) if before is not None else frozenset()
            resized = own if before is not None and len(own) != req.nodes_per_instance else frozenset()
            placed = _place_one(req, index, by_name, taken, policy, sites, reqs, resized)
            avoid = still_running - own
            if isinstance(placed, InstanceSite) and avoid & set(placed.nodes):
                spared = _place_one(req, index, by_name, taken | avoid, policy, sites, reqs, resized)
                if isinstance(spared, InstanceSite) and KIND_RANK[spared.kind] <= KIND_RANK[placed.kind]:
                    placed = spared  # as good a kind of domain, without waiting on another instance
            if isinstance(placed, InstanceSite):
                taken.update(placed.nodes)
                sites[placed.key] = placed
            else:
                waiting.append(placed)
    ordered = tuple(sorted(sites.values(), key=lambda p: (p.pool, p.index)))
    return TopologyPlan(ordered, tuple(sorted(waiting, key=lambda w: (w.pool, w.index))))


KIND_RANK = {"nvlink": 0, "node": 0, "rack": 1}  # an NVLink domain (or one node) before a rack


def _place_one(
    req: PoolRequest,
    index: int,
    by_name: Mapping[str, NodeInfo],
    taken: set[str],
    policy: TopologyPolicy,
    sites: Mapping[tuple[str, int], InstanceSite],
    reqs: Mapping[str, PoolRequest],
    own: frozenset[str] = frozenset(),
) -> InstanceSite | Waiting:
    free_nodes = [
        n for n in by_name.values() if n.name not in taken and _eligible(n, policy, req.gpus_per_node)
    ]
    domains = _domains(free_nodes, policy, req)
    fitting = [d for d in domains if len(d.nodes) >= req.nodes_per_instance]
    if not fitting:
        return _waiting(req, index, domains, by_name, policy)
    if policy.colocate_pools:
        fitting_here = _beside_other_pools(fitting, req, sites, by_name, policy)
        if fitting_here is None:
            return Waiting(
                req.pool,
                index,
                "WaitingForCapacity",
                f"{req.pool} instance {index} needs {req.nodes_per_instance} nodes with {req.gpus_per_node} free "
                "GPUs in the NVLink domain of the other pool's instances (the KV cache moves over NVLink "
                "only: the pods have no RDMA NIC); none has room",
            )
        fitting = fitting_here

    same_pool: defaultdict[tuple[str, str], int] = defaultdict(int)
    for p in sites.values():
        if p.pool == req.pool:
            same_pool[(p.kind, p.domain)] += 1
    other_zones = {
        _zone(by_name[n].labels, policy)
        for p in sites.values()
        if p.pool != req.pool and p.pool in reqs
        for n in p.nodes
        if n in by_name
    }

    def score(d: _Domain) -> tuple[int, int, int, int, str]:
        kind_rank = KIND_RANK[d.kind]
        zones = {_zone(n.labels, policy) for n in d.nodes}
        near_other = 0 if not other_zones or zones & other_zones else 1
        spread = same_pool[(d.kind, d.name)]
        # Co-placed pools: beside the other pool first, spreading one pool's instances second.
        first, second = (near_other, spread) if policy.colocate_pools else (spread, near_other)
        return (kind_rank, first, second, len(d.nodes) - req.nodes_per_instance, d.name)

    best = min(fitting, key=score)
    chosen = sorted(best.nodes, key=lambda n: (n.name not in own, n.free_gpus - req.gpus_per_node, n.name))[
        : req.nodes_per_instance
    ]
    return InstanceSite(
        req.pool, index, best.kind, best.label, best.name, tuple(sorted(n.name for n in chosen))
    )


def _beside_other_pools(
    fitting: list[_Domain],
    req: PoolRequest,
    sites: Mapping[tuple[str, int], InstanceSite],
    by_name: Mapping[str, NodeInfo],
    policy: TopologyPolicy,
) -> list[_Domain] | None:
    """The candidate domains inside the NVLink domains the other pools already use (all of them when
    nothing is placed yet); None when none is."""
    label = policy.nvlink_label or ""
    taken = {
        by_name[n].labels.get(label)
        for p in sites.values()
        if p.pool != req.pool
        for n in p.nodes
        if n in by_name
    }
    if not taken:
        return fitting
    inside = [d for d in fitting if all(n.labels.get(label) in taken for n in d.nodes)]
    return inside or None


def _waiting(
    req: PoolRequest,
    index: int,
    domains: Sequence[_Domain],
    by_name: Mapping[str, NodeInfo],
    policy: TopologyPolicy,
) -> Waiting:
    where = "one NVLink domain" if req.needs_multi_node_nvlink else "one NVLink domain or rack"
    if req.nodes_per_instance == 1 and not req.needs_multi_node_nvlink:
        where = "any node"
    best = max(domains, key=lambda d: len(d.nodes), default=None)
    if best is None:
        matching = [
            n for n in by_name.values() if all(n.labels.get(k) == v for k, v in policy.node_selector.items())
        ]
        have = (
            "no node matches the node selector"
            if not matching
            else f"no node has {req.gpus_per_node} free GPUs (of {len(matching)} matching nodes)"
        )
    else:
        kind = {"nvlink": "NVLink domain", "rack": "rack", "node": "node"}[best.kind]
        have = f"the best {kind}, {best.name}, has {len(best.nodes)}"
    tp_note = (
        f" (attention TP {req.tp_size} spans {req.tp_size // req.gpus_per_node} nodes and must stay in one NVLink domain)"
        if req.needs_multi_node_nvlink
        else ""
    )
    message = (
        f"{req.pool} instance {index} needs {req.nodes_per_instance} nodes with {req.gpus_per_node} free GPUs "
        f"in {where}{tp_note}; {have}"
    )
    return Waiting(req.pool, index, "WaitingForCapacity", message)
