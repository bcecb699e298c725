"""Everything one MoEDeployment owns, rendered from its spec and topology plan (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.api.derived import pools
from moe_operator.render import labels as L
from moe_operator.render.compute_domain import compute_domains
from moe_operator.render.engine import eplb_mode
from moe_operator.render.group import GroupBackend, Owner, RuntimeSettings, instance_objects
from moe_operator.render.monitoring import monitoring_objects
from moe_operator.render.network import network_objects
from moe_operator.render.shared import (
    engine_config_map,
    pool_disruption_budget,
    pool_service,
    router_objects,
    runtime_rbac,
)
from moe_operator.topology.planner import TopologyPlan


def placement_versions(status: Mapping[str, Any]) -> dict[str, int]:
    """Published placement version per pool, from status.placement (written by the control loop)."""
    placement = status.get("placement") or {}
    return {
        pool: int(p["version"]) for pool, p in placement.items() if isinstance(p, dict) and p.get("version")
    }


def render_children(
    spec: MoEDeploymentSpec,
    owner: Owner,
    plan: TopologyPlan,
    settings: RuntimeSettings,
    placement: Mapping[str, int] | None = None,
    backend: GroupBackend = "StatefulSet",
    monitoring: Collection[str] = (),
    compute_domain: bool = False,
    serving: Mapping[str, int] | None = None,
    off: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Desired children, each annotated with a hash of its content (unchanged hash: no write).

    Instances that wait for capacity get no StatefulSet: never half a group. ``placement``:
    published placement versions per pool; in eplb mode static they are the boot placement.
    ``compute_domain``: ComputeDomains for the multi-node NVLink instances, and their pods' claims.
    ``serving``: instances per pool on the router's list (the autoscaler's; default all), less
    ``off``'s instance per pool (a width change drains it before it rolls).
    """
    objects: list[dict[str, Any]] = [*runtime_rbac(spec, owner)]
    if compute_domain:
        for cd in compute_domains(owner.name, owner.namespace, plan):
            cd["metadata"]["labels"] = L.base_labels(owner.name, "engine")
            cd["metadata"]["ownerReferences"] = [owner.reference()]
            objects.append(cd)
    for pool in pools(spec):
        config = engine_config_map(spec, owner, pool)
        objects += [config, pool_service(spec, owner, pool), pool_disruption_budget(owner, pool)]
        config_hash = L.content_hash(config["data"])
        boot = (placement or {}).get(pool, 0) if eplb_mode(spec, pool) == "static" else 0
        for instance in plan.sites:
            if instance.pool == pool:
                objects += instance_objects(
                    spec, owner, pool, instance, settings, config_hash, boot, backend, compute_domain
                )
    objects += router_objects(spec, owner, serving, off)
    objects += network_objects(spec, owner, settings.network)
    objects += [o for o in monitoring_objects(spec, owner) if o["kind"] in monitoring]
    for obj in objects:
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations[K.SPEC_HASH] = L.content_hash({k: v for k, v in obj.items() if k != "status"})
    return objects
