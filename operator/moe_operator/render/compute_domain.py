"""NVIDIA ComputeDomains: the IMEX channel that multi-node NVLink (GB200 NVL72) needs in every pod.

On NVL72 a pod reaches GPUs on other trays over NVLink only through an IMEX channel, which NVIDIA's
DRA driver hands out per ComputeDomain (resource.nvidia.com/v1beta1): the domain names a
ResourceClaimTemplate, every pod claims from it, and the driver runs the IMEX daemons on the
domain's nodes. Without the channel NCCL, DeepEP and Mooncake fall back to slower paths or fail
(SGLang 0.5.23 serving_hook warns "no IMEX channel is mounted"). One domain per NVLink domain the
deployment uses, so prefill and decode pods that share a rack share a channel (the KV cache moves
over NVLink between them). Shape as in Dynamo's GB200 Kubernetes recipes.
"""

from __future__ import annotations

from typing import Any

from moe_operator.render import labels as L
from moe_operator.topology.planner import TopologyPlan

COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"
CLAIM_NAME = "compute-domain-channel"


def compute_domain_name(owner_name: str, domain: str) -> str:
    """One per (deployment, NVLink domain): the domain's label value, hashed into a DNS-safe suffix."""
    return f"{owner_name}-cd-{L.content_hash(domain)[:8]}"


def channel_template_name(cd_name: str) -> str:
    return f"{cd_name}-channel"


def compute_domains(owner_name: str, namespace: str, plan: TopologyPlan) -> list[dict[str, Any]]:
    """The ComputeDomains of the planned multi-node instances (owner references are added by the caller).

    numNodes is 0: NVIDIA's CRD makes a ComputeDomain's spec immutable and deprecates numNodes (0 is
    its recommendation with IMEX daemons named by DNS, the default since driver 0.2), so a domain never
    has to change when the deployment scales within it."""
    domains = sorted({s.domain for s in plan.sites if s.kind == "nvlink" and len(s.nodes) > 1})
    return [
        {
            "apiVersion": COMPUTE_DOMAIN_API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": (name := compute_domain_name(owner_name, domain)), "namespace": namespace},
            "spec": {
                "numNodes": 0,
                "channel": {"resourceClaimTemplate": {"name": channel_template_name(name)}},
            },
        }
        for domain in domains
    ]


def pod_claims(owner_name: str, domain: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(pod resourceClaims, engine container resources.claims) for a pod in ``domain``."""
    template = channel_template_name(compute_domain_name(owner_name, domain))
    return [{"name": CLAIM_NAME, "resourceClaimTemplateName": template}], [{"name": CLAIM_NAME}]
