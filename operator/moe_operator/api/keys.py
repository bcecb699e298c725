"""Label and annotation keys, field managers: the operator's wire vocabulary, each defined once.

Users select on these labels, alerts relabel them and upgrades read the annotations back,
so they are API as much as the CRD is: rename one only with a fallback read of the old key.
"""

from __future__ import annotations

from typing import Final

from .names import GROUP

DOMAIN: Final = GROUP

# Labels on every child (and on engine pods).
DEPLOYMENT: Final = f"{DOMAIN}/deployment"
DEPLOYMENT_UID: Final = f"{DOMAIN}/deployment-uid"
POOL: Final = f"{DOMAIN}/pool"
INSTANCE: Final = f"{DOMAIN}/instance"
RANK: Final = f"{DOMAIN}/rank"
MANAGED_BY_KEY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "moe-operator"
COMPONENT: Final = "app.kubernetes.io/component"
ROUTER_WORKERS: Final = f"{DOMAIN}/router-workers"  # pools' listed instances, on an autoscaled router
POD_INDEX: Final = "apps.kubernetes.io/pod-index"  # set by the StatefulSet/LeaderWorkerSet controllers

# Annotations on children: what was rendered, where an instance runs, its group's lifecycle.
SPEC_HASH: Final = f"{DOMAIN}/spec-hash"
TEMPLATE_HASH: Final = f"{DOMAIN}/template-hash"
INSTANCE_NODES: Final = f"{DOMAIN}/instance-nodes"  # topology: the NVLink domain and nodes of an instance
INSTANCE_NODES_BEFORE_0_2: Final = f"{DOMAIN}/placement"  # the same, as written by earlier versions
GROUP_EPOCH: Final = f"{DOMAIN}/group-epoch"
GROUP_RESTARTS: Final = f"{DOMAIN}/group-restarts"
GROUP_MEMBERS: Final = f"{DOMAIN}/group-members"
BOOT_PLACEMENT: Final = f"{DOMAIN}/boot-placement-version"  # eplb mode static: expert placement to boot with

# Annotations on expert-placement ConfigMaps.
PLACEMENT_VERSION: Final = f"{DOMAIN}/placement-version"
PLACEMENT_PROVENANCE: Final = f"{DOMAIN}/placement-provenance"
PLACEMENT_PAUSED: Final = f"{DOMAIN}/placement-paused"

# Labels of node pools (moe_operator.topology.nodepools).
NODE_POOL: Final = f"{DOMAIN}/sandbox-pool"

# Field managers: whoever wrote a field is visible in managedFields.
FIELD_MANAGER: Final = "moe-operator"
LIFECYCLE_MANAGER: Final = "moe-operator-groups"
CLI_MANAGER: Final = "moe-operator-cli"

# kopf's own bookkeeping on MoEDeployments.
FINALIZER: Final = f"{DOMAIN}/finalizer"
