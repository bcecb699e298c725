"""Admission refuses what the API server would refuse in the pods the operator renders (engine
pods: render/group.py, render/engine_container.py; the router: render/shared.py), the edge cases
tests/api/test_children_dry_run.py found: env names and downward-API keys, resource quantities,
the /dev/shm size, tolerations, the model's mount path, required volume source fields.

Each case is a shipped example with a few values changed, refused at exactly one field (the
message names it and says what to change), and a near miss that admits, so each rule can fail
both ways. Admission runs as the webhook does: under the platform policy the examples need
(policies/platform/examples.yaml) in the namespace it grants host networking to.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.render.engine_container import engine_resources
from moe_operator.validation import validate
from moe_operator.validation.platform import PlatformPolicy

REPO = Path(__file__).resolve().parents[2]
POLICY = PlatformPolicy.from_file(REPO / "policies" / "platform" / "examples.yaml")
NAMESPACE = "default"  # policies/platform/examples.yaml grants hostNetwork there
FIX_WORDS = ("set ", "use ", "remove ", "add ", "keep ", "lower ", "quote ")

SINGLE = "qwen3-30b-a3b-single-node.yaml"
PD_H100 = "deepseek-v3-pd-h100.yaml"  # h100-ib: one rdma/ib device per pod
PD_ROCE = "qwen3-235b-fp8-pd-h200-roce.yaml"
GB200 = "deepseek-v3-gb200.yaml"  # hostPath weights under /raid/models

Patch = dict[str, Any]
"""spec paths (dots) -> value; None removes the field."""


@dataclass(frozen=True)
class Edge:
    """A spec the API server would refuse (``patch``), where and why admission refuses it, and a
    near miss (``near``) that it admits."""

    name: str
    example: str
    patch: Patch
    field: str
    text: str
    near: Patch = field(default_factory=dict)
    policy: PlatformPolicy = POLICY


def spec_of(example: str, patch: Patch) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples" / example).read_text())["spec"])
    for path, value in patch.items():
        *parents, leaf = path.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return spec


def _env(*entries: dict[str, Any]) -> Patch:
    return {"engine.env": list(entries)}


def _label_env(key: str, kind: str = "labels") -> Patch:
    return _env({"name": "RACK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{kind}['{key}']"}}})


def _resources(where: str = "engine", **sections: dict[str, Any]) -> Patch:
    return {f"{where}.resources": sections}


def _toleration(**fields: Any) -> Patch:
    return {"topology.tolerations": [{"key": "nvidia.com/gpu", **fields}]}


PREFIX_253 = ".".join(["p" * 63, "q" * 63, "r" * 63, "s" * 61])  # a DNS subdomain of 253 characters
assert len(PREFIX_253) == 253

EDGES: tuple[Edge, ...] = (
    # ---- 1. one env entry per name (a LeaderWorkerSet refuses two)
    Edge(
        "env-name-twice",
        PD_H100,
        _env({"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}),
        "spec.engine.env[1].name",
        "already set by spec.engine.env[0]",
        near=_env({"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT"}),
    ),
    Edge(
        "env-name-thrice-names-the-first",
        SINGLE,
        _env(
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "SGLANG_X", "value": "1"},
            {"name": "SGLANG_X", "value": "2"},
        ),
        "spec.engine.env[2].name",
        "already set by spec.engine.env[1]",
        near=_env({"name": "nccl_debug", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "INFO"}),
    ),
    # ---- 2. downward-API label and annotation keys
    Edge(
        "fieldref-label-key-with-a-space",
        SINGLE,
        _label_env("rack name"),
        "spec.engine.env[0].valueFrom.fieldRef.fieldPath",
        "name part 'rack name'",
        near=_label_env("topology.kubernetes.io/zone"),
    ),
    Edge(
        "fieldref-label-name-of-64",
        SINGLE,
        _label_env("example.com/" + "n" * 64),
        "spec.engine.env[0].valueFrom.fieldRef.fieldPath",
        "1 to 63",
        near=_label_env("example.com/" + "n" * 63),
    ),
    Edge(
        "fieldref-label-prefix-of-254",
        SINGLE,
        _label_env(PREFIX_253 + "x/rack"),
        "spec.engine.env[0].valueFrom.fieldRef.fieldPath",
        "not a DNS subdomain",
        near=_label_env(PREFIX_253 + "/" + "n" * 63),
    ),
    Edge(
        "fieldref-label-uppercase-prefix",
        SINGLE,
        _label_env("Example.com/rack"),
        "spec.engine.env[0].valueFrom.fieldRef.fieldPath",
        "not a DNS subdomain",
        # annotation keys are checked lowercased by the API server
        near=_label_env("Example.com/rack", "annotations"),
    ),
    Edge(
        "fieldref-empty-label-key",
        SINGLE,
        _label_env(""),
        "spec.engine.env[0].valueFrom.fieldRef.fieldPath",
        "name part ''",
        near=_label_env("a"),
    ),
    Edge(
        "fieldref-api-version",
        SINGLE,
        _env({"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName", "apiVersion": "v2"}}}),
        "spec.engine.env[0].valueFrom.fieldRef.apiVersion",
        "set v1",
        near=_env(
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName", "apiVersion": "v1"}}}
        ),
    ),
    Edge(
        "resourcefieldref-divisor",
        SINGLE,
        _env(
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "3"}}}
        ),
        "spec.engine.env[0].valueFrom.resourceFieldRef.divisor",
        "1Mi",
        near=_env(
            {
                "name": "MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            }
        ),
    ),
    Edge(
        "configmap-key-with-a-slash",
        SINGLE,
        _env({"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a/b"}}}),
        "spec.engine.env[0].valueFrom.configMapKeyRef.key",
        "not a ConfigMap key",
        policy=dataclasses.replace(POLICY, env_config_map_names=("cfg",)),
        near=_env({"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a.b_c-d"}}}),
    ),
    # ---- 3. resources (engine and router)
    Edge(
        "engine-memory-request-above-limit",
        PD_H100,
        _resources(requests={"memory": "2Ti"}, limits={"memory": "1Ti"}),
        "spec.engine.resources.requests.memory",
        "above its limit (1Ti)",
        near=_resources(requests={"memory": "1Ti"}, limits={"memory": "1024Gi"}),
    ),
    Edge(
        "engine-cpu-request-above-limit-in-other-units",
        SINGLE,
        _resources(requests={"cpu": "1500m"}, limits={"cpu": 1}),
        "spec.engine.resources.requests.cpu",
        "above its limit",
        near=_resources(requests={"cpu": "1000m"}, limits={"cpu": 1}),
    ),
    Edge(
        "engine-negative-cpu",
        SINGLE,
        _resources(requests={"cpu": "-1"}),
        "spec.engine.resources.requests.cpu",
        "negative",
        near=_resources(requests={"cpu": "0"}),
    ),
    Edge(
        "engine-not-a-quantity",
        SINGLE,
        _resources(requests={"memory": "lots"}),
        "spec.engine.resources.requests.memory",
        "not a Kubernetes quantity",
        near=_resources(requests={"memory": 0.5e12}),  # a YAML float is a quantity too
    ),
    Edge(
        "engine-unqualified-resource",
        SINGLE,
        _resources(limits={"gpu": "1"}),
        "spec.engine.resources.limits.gpu",
        "not a standard container resource",
        near=_resources(limits={"ephemeral-storage": "100Gi"}),
    ),
    Edge(
        "engine-extended-resource-name-too-long-for-its-quota",
        SINGLE,
        _resources(limits={PREFIX_253 + "/fpga": 1}),
        "spec.engine.resources.limits['" + PREFIX_253 + "/fpga']",
        "quota name",
        near=_resources(limits={PREFIX_253[9:] + "/fpga": 1}),
    ),
    Edge(
        "engine-fractional-extended-resource",
        SINGLE,
        _resources(limits={"example.com/fpga": "0.5"}),
        "spec.engine.resources.limits['example.com/fpga']",
        "whole number",
        near=_resources(limits={"example.com/fpga": "1"}),
    ),
    Edge(
        "engine-extended-request-without-limit",
        SINGLE,
        _resources(requests={"example.com/fpga": 2}),
        "spec.engine.resources.limits['example.com/fpga']",
        "is required",
        near=_resources(requests={"example.com/fpga": 2}, limits={"example.com/fpga": "2"}),
    ),
    Edge(
        "engine-extended-request-below-limit",
        SINGLE,
        _resources(requests={"example.com/fpga": 1}, limits={"example.com/fpga": 2}),
        "spec.engine.resources.requests['example.com/fpga']",
        "must equal its limit",
        near=_resources(limits={"example.com/fpga": 2}),  # the request defaults to the limit
    ),
    Edge(
        "engine-hugepages-without-limit",
        SINGLE,
        _resources(requests={"hugepages-2Mi": "1Gi"}),
        "spec.engine.resources.limits.hugepages-2Mi",
        "set limits hugepages-2Mi: 1Gi",
        near=_resources(requests={"hugepages-2Mi": "1Gi"}, limits={"hugepages-2Mi": "1024Mi"}),
    ),
    Edge(
        "engine-hugepages-not-whole-pages",
        SINGLE,
        _resources(limits={"hugepages-2Mi": "3Mi"}),
        "spec.engine.resources.limits.hugepages-2Mi",
        "whole number of 2Mi pages",
        near=_resources(limits={"hugepages-2Mi": "4Mi"}),
    ),
    Edge(
        "engine-hugepages-without-a-page-size",
        SINGLE,
        _resources(limits={"hugepages-big": "1Gi"}),
        "spec.engine.resources.limits.hugepages-big",
        "does not name a page size",
        near=_resources(limits={"hugepages-1Gi": "1Gi"}),
    ),
    Edge(
        "engine-resource-claims",
        SINGLE,
        _resources(claims=[{"name": "gpu"}], requests={"cpu": "8"}),
        "spec.engine.resources.claims",
        "resource claims",
        near=_resources(requests={"cpu": "8"}),
    ),
    Edge(
        "engine-rdma-device",
        PD_H100,
        _resources(limits={"rdma/ib": 2}),
        "spec.engine.resources.limits",
        "one RDMA device",
        near=_resources(limits={"example.com/fpga": 2}),
    ),
    Edge(
        "router-memory-request-above-limit",
        SINGLE,
        _resources("router", requests={"memory": "2Gi"}, limits={"memory": "1Gi"}),
        "spec.router.resources.requests.memory",
        "above its limit (1Gi)",
        near=_resources("router", requests={"memory": "1Gi"}, limits={"memory": "2Gi"}),
    ),
    Edge(
        "router-hugepages-alone",
        SINGLE,
        _resources("router", limits={"hugepages-2Mi": "2Mi"}),
        "spec.router.resources",
        "without cpu or memory",
        # the engine always has the operator's cpu and memory requests beside them
        near=_resources(limits={"hugepages-2Mi": "2Mi"}),
    ),
    Edge(
        "router-negative-memory-limit",
        PD_ROCE,
        _resources("router", limits={"memory": "-512Mi"}),
        "spec.router.resources.limits.memory",
        "negative",
        near=_resources("router", limits={"memory": "512Mi"}),
    ),
    # ---- 4. /dev/shm size
    Edge(
        "shared-memory-negative",
        SINGLE,
        {"engine.sharedMemorySize": "-1Gi"},
        "spec.engine.sharedMemorySize",
        "positive size",
        near={"engine.sharedMemorySize": "1Gi"},
    ),
    Edge(
        "shared-memory-zero",
        SINGLE,
        {"engine.sharedMemorySize": 0},
        "spec.engine.sharedMemorySize",
        "set one such as 64Gi",
        near={"engine.sharedMemorySize": "0.5Ti"},
    ),
    # ---- 5. tolerations
    Edge(
        "toleration-exists-with-value",
        PD_H100,
        _toleration(operator="Exists", value="present", effect="NoSchedule"),
        "spec.topology.tolerations[0].value",
        "must be empty with operator Exists",
        near=_toleration(operator="Equal", value="present", effect="NoSchedule"),
    ),
    Edge(
        "toleration-value-of-64",
        PD_H100,
        _toleration(value="v" * 64, effect="NoSchedule"),
        "spec.topology.tolerations[0].value",
        "not a label value",
        near=_toleration(value="v" * 63, effect="NoSchedule"),
    ),
    Edge(
        "toleration-value-not-a-label-value",
        SINGLE,
        _toleration(operator="Equal", value="h100:sxm"),
        "spec.topology.tolerations[0].value",
        "not a label value",
        near=_toleration(operator="", value="h100.sxm_5-a"),  # an empty operator means Equal
    ),
    Edge(
        "toleration-value-not-a-string",
        SINGLE,
        _toleration(value=1),
        "spec.topology.tolerations[0].value",
        "quote it",
        near=_toleration(value="1"),
    ),
    Edge(
        "toleration-key-not-a-qualified-name",
        SINGLE,
        {"topology.tolerations": [{"key": "nvidia.com/gpu type", "operator": "Exists"}]},
        "spec.topology.tolerations[0].key",
        "is not a taint key",
        near={"topology.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
    ),
    Edge(
        "toleration-effect",
        SINGLE,
        _toleration(operator="Exists", effect="NoAdmit"),
        "spec.topology.tolerations[0].effect",
        "NoSchedule, PreferNoSchedule or NoExecute",
        near=_toleration(operator="Exists", effect="PreferNoSchedule"),
    ),
    Edge(
        "toleration-seconds-without-noexecute",
        SINGLE,
        _toleration(operator="Exists", effect="NoSchedule", tolerationSeconds=300),
        "spec.topology.tolerations[0].tolerationSeconds",
        "needs effect NoExecute",
        near=_toleration(operator="Exists", effect="NoExecute", tolerationSeconds=300),
    ),
    Edge(
        "toleration-seconds-a-boolean",
        SINGLE,
        _toleration(operator="Exists", effect="NoExecute", tolerationSeconds=True),
        "spec.topology.tolerations[0].tolerationSeconds",
        "whole number of seconds",
        near=_toleration(operator="Exists", effect="NoExecute", tolerationSeconds=0),
    ),
    # ---- 6. the model's mount path against the operator's own mounts
    Edge(
        "model-path-dev-shm",
        SINGLE,
        {"model.path": "/dev/shm"},
        "spec.model.path",
        "is /dev/shm",
        near={"model.path": "/dev/shmem"},  # a sibling, not the same path component
    ),
    Edge(
        "model-path-dev-shm-spelled-otherwise",
        SINGLE,
        {"model.path": "/dev/shm/"},
        "spec.model.path",
        "is /dev/shm",
        near={"model.path": "/models/shm/"},
    ),
    Edge(
        "model-path-runtime-dir",
        SINGLE,
        {"model.path": "/opt/moe-runtime"},
        "spec.model.path",
        "is /opt/moe-runtime",
        near={"model.path": "/opt/moe-runtime-models"},
    ),
    Edge(
        "model-path-under-the-token-dir",
        PD_H100,
        {"model.path": "/etc/moe/token/models"},
        "spec.model.path",
        "lies under /etc/moe/token",
        near={"model.path": "/etc/moe-models"},
    ),
    Edge(
        "model-path-over-the-engine-config",
        PD_ROCE,
        {"model.path": "/etc/moe"},
        "spec.model.path",
        "contains /etc/moe/engine",
        near={"model.path": "/srv/moe"},
    ),
    Edge(
        "model-path-root",
        GB200,
        {"model.path": "/"},
        "spec.model.path",
        "contains /dev/shm",
        near={"model.path": "/models"},
    ),
    Edge(
        "model-path-kernel-cache",
        SINGLE,
        {"model.path": "/var/cache/moe-kernels", "engine.kernelCacheClaim": "kernels"},
        "spec.model.path",
        "is /var/cache/moe-kernels",
        near={"model.path": "/var/cache/moe-kernels"},  # mounted only with a kernelCacheClaim
    ),
    Edge(
        "model-path-placement-dir-without-volume-is-no-mount",
        SINGLE,
        {"model.path": "/etc/moe/placement"},
        "spec.model.path",
        "is /etc/moe/placement",
        near={"model.path": "/etc/moe/placement", "model.volume": None},  # no volume, no mount
    ),
    # ---- 7. required fields of the volume sources
    Edge(
        "pvc-without-claim-name",
        SINGLE,
        {"model.volume": {"persistentVolumeClaim": {"readOnly": True}}},
        "spec.model.volume.persistentVolumeClaim.claimName",
        "is required",
        near={"model.volume": {"persistentVolumeClaim": {"claimName": "m", "readOnly": True}}},
    ),
    Edge(
        "pvc-empty-claim-name",
        SINGLE,
        {"model.volume": {"persistentVolumeClaim": {"claimName": ""}}},
        "spec.model.volume.persistentVolumeClaim.claimName",
        "is required",
        near={"model.volume": {"persistentVolumeClaim": {"claimName": "models"}}},
    ),
    Edge(
        "nfs-without-server",
        SINGLE,
        {"model.volume": {"nfs": {"path": "/export/models"}}},
        "spec.model.volume.nfs.server",
        "is required",
        near={"model.volume": {"nfs": {"server": "10.0.0.7", "path": "/export/models"}}},
    ),
    Edge(
        "nfs-relative-path",
        SINGLE,
        {"model.volume": {"nfs": {"server": "nfs.example.com", "path": "export/models"}}},
        "spec.model.volume.nfs.path",
        "absolute path",
        near={"model.volume": {"nfs": {"server": "nfs.example.com", "path": "/"}}},
    ),
    Edge(
        "csi-without-driver",
        SINGLE,
        {"model.volume": {"csi": {"readOnly": True}}},
        "spec.model.volume.csi.driver",
        "is required",
        near={"model.volume": {"csi": {"driver": "file.csi.example.com", "readOnly": True}}},
    ),
    Edge(
        "csi-driver-name",
        SINGLE,
        {"model.volume": {"csi": {"driver": "file csi"}}},
        "spec.model.volume.csi.driver",
        "not a CSI driver name",
        near={"model.volume": {"csi": {"driver": "File_CSI.example.com"}}},
    ),
    Edge(
        "image-without-reference",
        SINGLE,
        {"model.volume": {"image": {"pullPolicy": "IfNotPresent"}}},
        "spec.model.volume.image.reference",
        "is required",
        near={
            "model.volume": {"image": {"reference": "registry.example.com/m:1", "pullPolicy": "IfNotPresent"}}
        },
    ),
    Edge(
        "image-pull-policy",
        SINGLE,
        {"model.volume": {"image": {"reference": "registry.example.com/m:1", "pullPolicy": "Sometimes"}}},
        "spec.model.volume.image.pullPolicy",
        "not a pull policy",
        near={"model.volume": {"image": {"reference": "registry.example.com/m:1"}}},
    ),
    Edge(
        "host-path-without-path",
        GB200,
        {"model.volume": {"hostPath": {"type": "Directory"}}},
        "spec.model.volume.hostPath.path",
        "is required",
        near={"model.volume": {"hostPath": {"path": "/raid/models/dsv3", "type": "Directory"}}},
    ),
)


def test_examples_are_admitted_as_shipped() -> None:
    for example in (SINGLE, PD_H100, PD_ROCE, GB200):
        assert validate(spec_of(example, {}), policy=POLICY, namespace=NAMESPACE) == [], example


def test_case_names_are_unique() -> None:
    names = [e.name for e in EDGES]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e.name)
def test_edge_is_refused_at_its_field(edge: Edge) -> None:
    problems = validate(spec_of(edge.example, edge.patch), policy=edge.policy, namespace=NAMESPACE)
    # Refused there and nowhere else (another rule may add its own word on the same field).
    assert {p.field for p in problems} == {edge.field}, [str(p) for p in problems]
    message = next((p.message for p in problems if edge.text in p.message), None)
    assert message is not None, f"{edge.text!r} not in {[p.message for p in problems]}"
    assert message.startswith(edge.field), "the message must name the field"
    assert any(word in message for word in FIX_WORDS), f"the message must say what to change: {message}"


@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e.name)
def test_near_miss_is_admitted(edge: Edge) -> None:
    assert edge.near, "every edge has a near miss"
    problems = validate(spec_of(edge.example, edge.near), policy=edge.policy, namespace=NAMESPACE)
    assert problems == [], [str(p) for p in problems]


@pytest.mark.parametrize(
    ("limits", "requests"),
    [({"memory": "1Gi"}, {}), ({"cpu": "1"}, {}), ({"ephemeral-storage": "1Gi"}, {"cpu": "4"})],
)
def test_a_limit_below_the_operators_default_request_is_admitted_and_rendered_within_it(
    limits: dict[str, str], requests: dict[str, str]
) -> None:
    """The operator requests cpu, memory and ephemeral-storage by default only where the spec
    neither requests nor limits them (render.engine_container): a low limit of the spec's never
    sits under a default request, so admission need not refuse it."""
    raw = spec_of(SINGLE, _resources(limits=limits, requests=requests))
    assert validate(raw, policy=POLICY, namespace=NAMESPACE) == []
    rendered = engine_resources(MoEDeploymentSpec.model_validate(raw))
    for name, limit in limits.items():
        assert rendered["limits"][name] == limit
        assert name not in rendered["requests"], rendered


def test_policy_none_still_refuses_env_and_resources() -> None:
    """Offline tools (policy=None) leave the platform's grants out, not what Kubernetes refuses in
    the env and resources (the tolerations and model volume rules run under a policy only)."""
    raw = spec_of(
        SINGLE,
        {
            **_env({"name": "A", "value": "1"}, {"name": "A", "value": "2"}),
            **_resources(requests={"cpu": "-1"}),
            "engine.sharedMemorySize": "-1Gi",
        },
    )
    fields = sorted(p.field for p in validate(raw, policy=None))
    assert fields == [
        "spec.engine.env[1].name",
        "spec.engine.resources.requests.cpu",
        "spec.engine.sharedMemorySize",
    ]
