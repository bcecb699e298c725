"""Build the MoEDeployment CustomResourceDefinition from the pydantic models."""

from __future__ import annotations

from typing import Any

from .base import cel
from .names import (
    CATEGORIES,
    CRD_NAME,
    GROUP,
    KIND,
    LIST_KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from .spec import MoEDeploymentSpec
from .status import MoEDeploymentStatus
from .structural import JsonSchema, structural

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether every pool serves (the Ready condition).",
    },
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.pools.prefill.ready",
        "description": "Ready/desired prefill instances.",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.pools.decode.ready",
        "description": "Ready/desired decode instances.",
    },
    {
        "name": "Balancedness",
        "type": "number",
        "jsonPath": ".status.placement.decode.measuredBalancedness",
        "description": "Measured expert balancedness of the decode pool (1.0 = perfect).",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Model",
        "type": "string",
        "jsonPath": ".spec.model.name",
        "priority": 1,
        "description": "Model served.",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Progressing")].reason',
        "priority": 1,
        "description": "Why the deployment is still progressing.",
    },
]

SCALE_SUBRESOURCE: dict[str, str] = {
    "specReplicasPath": ".spec.decode.replicas",
    "statusReplicasPath": ".status.pools.decode.replicas",
    "labelSelectorPath": ".status.pools.decode.selector",
}

NAME_RULES = [
    cel(
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters: child StatefulSets, Services and "
        "pods append suffixes and must stay within 63",
    ),
    cel(
        "self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must be a DNS label (lower-case letters, digits and '-'): the operator's Services "
        "and StatefulSets are named after it",
    ),
    cel(
        "!has(self.spec.topology) || !has(self.spec.topology.groupBackend) "
        "|| self.spec.topology.groupBackend == 'StatefulSet' || self.metadata.name.matches('^[a-z]')",
        "metadata.name must start with a letter where instances may be LeaderWorkerSets "
        "(spec.topology.groupBackend auto or LeaderWorkerSet): its webhook takes DNS-1035 names only",
    ),
    cel(
        "!has(self.spec.topology) || !has(self.spec.topology.groupBackend) "
        "|| self.spec.topology.groupBackend == 'StatefulSet' "
        "|| (self.metadata.name.size() + string(self.spec.decode.replicas - 1).size() <= 42 "
        "&& (!has(self.spec.prefill) || self.metadata.name.size() + string(self.spec.prefill.replicas - 1).size() <= 41))",
        "metadata.name is too long for this many instances as LeaderWorkerSets: its controller names the "
        "worker pods' revision label <name>-<pool>-<instance>-0-<hash>, at most 63 characters; shorten "
        "the name or set spec.topology.groupBackend: StatefulSet",
    ),
]


def spec_schema() -> JsonSchema:
    """Structural schema of .spec."""
    return structural(MoEDeploymentSpec.model_json_schema(by_alias=True))


def status_schema() -> JsonSchema:
    """Structural schema of .status."""
    return structural(MoEDeploymentStatus.model_json_schema(by_alias=True), defaults=False)


def openapi_schema() -> JsonSchema:
    """The whole object's openAPIV3Schema."""
    return {
        "type": "object",
        "description": "MoEDeployment serves one Mixture-of-Experts model with expert parallelism on "
        "Kubernetes: a decode pool (and optionally a prefill pool for P/D disaggregation) of multi-node "
        "SGLang instances, a router in front, and cluster-level expert placement (EPLB).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
            "kind": {"type": "string", "description": "Kind of this object: MoEDeployment."},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": NAME_RULES,
    }


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict, ready to dump as YAML or apply."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "annotations": {"moe.inference.dev/generated-by": "moe-operator crds generate"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": LIST_KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}, "scale": dict(SCALE_SUBRESOURCE)},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                }
            ],
        },
    }
