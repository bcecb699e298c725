"""Seeded MoEDeployments for the admission-implies-reconcile property (test_children_dry_run.py).

Three sets:

- the shipped examples, unchanged;
- ``count`` generated specs: an example mutated within the schema and within what Kubernetes itself
  accepts (names and namespaces at their length limits, pool shapes and replicas up to the bounds,
  router and engine ports, resource quantities, env entries, tolerations, label keys with
  253-character prefixes and 63-character names, 63-character and empty label values, model names
  and paths, volume sources, hardware profiles or none, monitoring, EPLB modes and durations, KV
  transfer backends). Deterministic for a seed (``random.Random``);
- one spec per edge case (EDGE_CASES): an example with one value the CRD schema lets through whose
  Kubernetes validity is the question (a port the runtime listens on too, a request above its
  limit, a label name of 64 characters, a name that is not a DNS label...). Admission must refuse
  it, or the children must take it.

Each spec lists what was changed (``field=value``; ``edge:`` for the edge case), so a failure names
it.
"""

from __future__ import annotations

import copy
import math
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.derived import pool_layout, pools, resolve_architecture
from moe_operator.api.names import MAX_NAME_LENGTH
from moe_operator.hardware import lookup_profile, profile_names

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = tuple(sorted((REPO / "examples").glob("*.yaml")))

LOWER = string.ascii_lowercase
ALNUM = LOWER + string.digits


@dataclass(frozen=True)
class Generated:
    """One generated MoEDeployment: the example it came from, the namespace it goes to, and what
    the generator changed."""

    index: int
    kind: Literal["example", "generated", "edge"]
    base: str
    obj: dict[str, Any]
    namespace: str
    mutations: tuple[str, ...]

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.obj["spec"]
        return spec

    def describe(self) -> str:
        lines = [f"spec #{self.index} ({self.kind}) from examples/{self.base} in namespace {self.namespace}:"]
        lines += [f"    {m}" for m in self.mutations]
        return "\n".join(lines)


def _word(rng: random.Random, length: int, alphabet: str = ALNUM) -> str:
    """``length`` characters starting and ending with a letter (a DNS-1035 label when <= 63)."""
    if length <= 2:
        return "".join(rng.choice(LOWER) for _ in range(length))
    middle = "".join(rng.choice(alphabet + "-") for _ in range(length - 2)).replace("--", "-a")[: length - 2]
    return rng.choice(LOWER) + middle + rng.choice(LOWER)


def _dns_subdomain(rng: random.Random, length: int) -> str:
    """A DNS-1123 subdomain of exactly ``length`` (<= 253) characters, labels of at most 63."""
    sizes: list[int] = []
    left = length
    while left > 63:
        sizes.append(min(63, left - 2))  # leave a label of at least one character after the dot
        left -= sizes[-1] + 1
    labels = [_word(rng, size) for size in (*sizes, left)]
    return ".".join(labels)


def label_key(rng: random.Random) -> str:
    """A qualified label key, often at its limits (253-character prefix, 63-character name)."""
    options: list[Callable[[], str]] = [
        lambda: f"example.com/{_word(rng, 63)}",
        # 252: the spec's LabelKey allows 316 characters, one less than Kubernetes (253 + 1 + 63)
        lambda: f"{_dns_subdomain(rng, 252)}/{_word(rng, 63)}",
        lambda: _word(rng, 63, ALNUM + "_."),
        lambda: "node.kubernetes.io/instance-type",
        lambda: f"{_dns_subdomain(rng, rng.randint(4, 40))}/{_word(rng, rng.randint(1, 20))}",
    ]
    return rng.choice(options)()


def label_value(rng: random.Random) -> str:
    """A label value, often 63 characters or empty."""
    options: list[Callable[[], str]] = [
        lambda: _word(rng, 63, ALNUM + "-_."),
        lambda: "",
        lambda: "NVIDIA-H100-80GB-HBM3",
        lambda: f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}_{_word(rng, 5)}",
    ]
    return rng.choice(options)()


def deployment_name(rng: random.Random, base: str) -> tuple[str, str]:
    """(name, how): the example's, one at the 40-character limit, near it, or one character."""
    style = rng.choices(["example", "max", "near-max", "one"], [3, 6, 3, 1])[0]
    if style == "example":
        return base, style
    if style == "max":
        return _word(rng, MAX_NAME_LENGTH), style
    if style == "near-max":
        return _word(rng, rng.randint(30, MAX_NAME_LENGTH - 1)), style
    return rng.choice(LOWER), style


# --------------------------------------------------------------------------- mutations

Mutation = Callable[[random.Random, dict[str, Any]], list[str]]


def _set(spec: dict[str, Any], path: str, value: Any) -> str:
    """Set spec.<path> (dots; created on the way) and return ``spec.path=value``."""
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return f"spec.{path}={value!r}"


def _hardware(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    """A profile for a spec without one; another profile of the same GPU (IB <-> RoCE); or none, with
    the profile's node shape spelled out."""
    topo = spec.setdefault("topology", {})
    current = topo.get("hardware")
    if current is None:
        profile_name = rng.choice(["h100-ib", "h100-roce", "h200-ib", "h200-roce", "b200-ib"])
        for field in ("gpusPerNode", "gpuMemory"):
            topo.pop(field, None)
        return [_set(spec, "topology.hardware", profile_name)]
    siblings: dict[str, list[str | None]] = {
        "h100-ib": ["h100-roce", None],
        "h100-roce": ["h100-ib", None],
        "h200-ib": ["h200-roce"],
        "h200-roce": ["h200-ib", None],
        "gb200-nvl72": [None],
        "b200-ib": [None],
    }
    choice = rng.choice(siblings.get(current, [None]))
    assert choice is None or choice in profile_names()
    if choice is not None:
        return [_set(spec, "topology.hardware", choice)]
    # No profile: the same node shape written out (what the profile would have filled in).
    profile = lookup_profile(current)
    topo.pop("hardware")
    out = ["spec.topology.hardware removed"]
    out.append(_set(spec, "topology.gpusPerNode", profile.gpus_per_node))
    out.append(_set(spec, "topology.gpuMemory", profile.gpu_memory))
    if profile.nvlink_domain_size != profile.gpus_per_node:
        out.append(_set(spec, "topology.nvlinkDomainSize", profile.nvlink_domain_size))
    if profile.rdma_resource_name:
        out.append(_set(spec, "topology.rdmaResourceName", profile.rdma_resource_name))
    if profile.host_network:
        out.append(_set(spec, "topology.hostNetwork", True))
    return out


# Pool shapes per example that fit its hardware and model (validation filters the rest).
NODES_PER_REPLICA = {
    "qwen3-30b-a3b-single-node.yaml": {"decode": [1, 1, 2, 4]},
    "deepseek-v3-gb200.yaml": {"prefill": [2, 2, 2, 4], "decode": [4, 8, 12, 16]},
    "deepseek-v3-pd-h100.yaml": {"prefill": [2, 4, 4, 8], "decode": [4, 8, 9]},
    "qwen3-235b-fp8-pd-h200-roce.yaml": {"prefill": [1, 2], "decode": [1, 2, 4]},
}
REPLICAS = [0, 1, 1, 2, 2, 3, 5, 10, 17, 100, 256]


def _pools(rng: random.Random, spec: dict[str, Any], base: str) -> list[str]:
    out = []
    for pool, shapes in NODES_PER_REPLICA[base].items():
        if pool not in spec:
            continue
        if rng.random() < 0.6:
            out.append(_set(spec, f"{pool}.replicas", rng.choice(REPLICAS)))
        if rng.random() < 0.5:
            out.append(_set(spec, f"{pool}.nodesPerReplica", rng.choice(shapes)))
            spec[pool].pop("attentionDataParallel", None)
        if rng.random() < 0.4:
            # A symbol for now: _attention_dp sets the number once the node shape is final.
            spec[pool]["attentionDataParallel"] = rng.choice(["world", "half", "node"])
    return out


def _gpus_per_node(spec: dict[str, Any]) -> int:
    topo = spec.get("topology") or {}
    if "gpusPerNode" in topo:
        return int(topo["gpusPerNode"])
    return lookup_profile(topo["hardware"]).gpus_per_node if topo.get("hardware") else 8


def _attention_dp(spec: dict[str, Any]) -> list[str]:
    """Turn the symbolic attentionDataParallel choices into numbers for the pool's world."""
    out = []
    for pool in ("prefill", "decode"):
        choice = (spec.get(pool) or {}).get("attentionDataParallel")
        if not isinstance(choice, str):
            continue
        nodes = int(spec[pool].get("nodesPerReplica", 1))
        world = nodes * _gpus_per_node(spec)
        value = {"world": world, "half": max(world // 2, 1), "node": nodes}[choice]
        spec[pool]["attentionDataParallel"] = value
        out.append(f"spec.{pool}.attentionDataParallel={value} ({choice})")
    return out


def _expert_slots(spec: dict[str, Any]) -> list[str]:
    """redundantExperts so that experts + redundant divide every pool's EP size (the smallest such,
    or the example's when it still fits); mode off keeps 0 when that divides."""
    parsed = MoEDeploymentSpec.model_validate(spec)
    arch = resolve_architecture(parsed.model)
    assert arch is not None
    sizes = [pool_layout(p, parsed.topology).ep_size for p in pools(parsed).values()]
    step = math.lcm(*[s for s in sizes if s > 1] or [1])
    eplb = spec.setdefault("eplb", {})
    current = int(eplb.get("redundantExperts", 0))
    if (arch.routed_experts + current) % step == 0 and (current == 0 or eplb.get("mode") != "off"):
        return []
    fit = next((r for r in range(arch.routed_experts + 1) if (arch.routed_experts + r) % step == 0), None)
    if fit is None:
        return []  # no redundancy fits: validation refuses the shape, as it should
    out = [_set(spec, "eplb.redundantExperts", fit)]
    if fit and eplb.get("mode") == "off":
        out.append(_set(spec, "eplb.mode", "operator"))
    return out


def _router(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    if rng.random() < 0.6:
        out.append(_set(spec, "router.replicas", rng.choice([0, 1, 2, 3, 64])))
    if rng.random() < 0.6:
        out.append(_set(spec, "router.port", rng.choice([1, 80, 443, 1023, 1024, 8080, 65535])))
    if rng.random() < 0.3:
        out.append(_set(spec, "router.policy", rng.choice(["round_robin", "random", "power_of_two"])))
    if rng.random() < 0.3:
        out.append(_set(spec, "router.resources", _resources(rng)))
    if rng.random() < 0.2:
        out.append(_set(spec, "router.image", _image(rng)))
    return out


ENGINE_PORTS = [1, 80, 1023, 1024, 8000, 8080, 30000, 31000, 65535]


def _ports(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    if rng.random() < 0.5:
        out.append(_set(spec, "engine.port", rng.choice(ENGINE_PORTS)))
    if rng.random() < 0.4:
        out.append(_set(spec, "engine.distInitPort", rng.choice([2, 5000, 20102, 29500, 65534])))
    if "prefill" in spec and rng.random() < 0.4:
        out.append(_set(spec, "kvTransfer.bootstrapPort", rng.choice([3, 8998, 9000, 40000, 65533])))
    return out


QUANTITIES: dict[str, list[Any]] = {
    "cpu": ["64", "500m", "0.5", "1", 96, "100", "2k", "1500m"],
    "memory": ["1000Gi", "1500Gi", "512Mi", "2Ti", "1e12", "100G", "1.5Ti", 68719476736],
    "ephemeral-storage": ["20Gi", "100Gi", "1Ti", "500G"],
}


def _resources(rng: random.Random) -> dict[str, Any]:
    """ResourceRequirements with requests no greater than limits (Kubernetes refuses otherwise)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for name, values in QUANTITIES.items():
        style = rng.choice(["none", "request", "limit", "both"])
        value = rng.choice(values)
        if style in ("request", "both"):
            requests[name] = value
        if style == "limit":
            limits[name] = value
        if style == "both" and name != "cpu":  # a limit equal to the request (no CPU limit: throttling)
            limits[name] = value
    if rng.random() < 0.2:
        # An extended resource the platform advertises (requests must equal limits, whole numbers).
        limits["example.com/fpga"] = requests["example.com/fpga"] = str(rng.randint(1, 4))
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _image(rng: random.Random) -> str:
    return rng.choice(
        [
            "lmsysorg/sglang:v0.5.23",
            f"registry.{_word(rng, 20)}.example.com:5000/{_word(rng, 30)}/sglang:v0.5.23-cu129",
            "ghcr.io/moe-inference/sglang@sha256:"
            + "".join(rng.choice("0123456789abcdef") for _ in range(64)),
        ]
    )


def _engine(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    if rng.random() < 0.5:
        out.append(_set(spec, "engine.resources", _resources(rng)))
    if rng.random() < 0.3:
        out.append(
            _set(spec, "engine.sharedMemorySize", rng.choice(["1Gi", "64Gi", "128Gi", "0.5Ti", "100G"]))
        )
    if rng.random() < 0.3:
        out.append(_set(spec, "engine.image", _image(rng)))
    if rng.random() < 0.2:
        out.append(_set(spec, "engine.imagePullPolicy", rng.choice(["Always", "Never", "IfNotPresent"])))
    if rng.random() < 0.2:
        out.append(_set(spec, "engine.imagePullSecrets", [_word(rng, 63), "regcred"]))
    if rng.random() < 0.3:
        out.append(_set(spec, "engine.startupTimeout", rng.choice(["1m", "45m", "2h30m", "4h"])))
    if rng.random() < 0.5:
        out.append(_set(spec, "engine.env", _env(rng)))
    return out


def _env(rng: random.Random) -> list[dict[str, Any]]:
    choices: list[Callable[[], dict[str, Any]]] = [
        lambda: {"name": "NCCL_DEBUG", "value": rng.choice(["INFO", "WARN", ""])},
        lambda: {"name": "SGLANG_" + _word(rng, 40, string.ascii_uppercase + "_").upper(), "value": "1"},
        lambda: {"name": "my.setting-" + _word(rng, 8), "value": "x" * rng.choice([1, 1024, 8192])},
        lambda: {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        lambda: {
            "name": "ZONE",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label_key(rng)}']"}},
        },
        lambda: {
            "name": "MEM_LIMIT",
            "valueFrom": {
                "resourceFieldRef": {
                    "resource": rng.choice(["limits.memory", "requests.cpu", "limits.ephemeral-storage"]),
                    **({"containerName": "engine"} if rng.random() < 0.5 else {}),
                }
            },
        },
        lambda: {"name": "HOST_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIPs"}}},
    ]
    entries = [rng.choice(choices)() for _ in range(rng.randint(1, 5))]
    return list({e["name"]: e for e in entries}.values())  # one entry per name


def _scheduling(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    topo = spec.setdefault("topology", {})
    if rng.random() < 0.5:
        tolerations = [
            rng.choice(
                [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "nvidia.com/gpu", "operator": "Equal", "value": label_value(rng)},
                    {"key": "nvidia.com/gpu", "operator": "Exists"},
                    {
                        "key": "nvidia.com/gpu",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": rng.choice([0, 300, 86400]),
                    },
                    {"key": "nvidia.com/gpu", "effect": "PreferNoSchedule", "value": "present"},
                ]
            )
            for _ in range(rng.randint(1, 3))
        ]
        out.append(_set(spec, "topology.tolerations", tolerations))
    if rng.random() < 0.5:
        selector = dict(topo.get("nodeSelector") or {})
        for _ in range(rng.randint(1, 3)):
            selector[label_key(rng)] = label_value(rng)
        out.append(_set(spec, "topology.nodeSelector", selector))
    if rng.random() < 0.25:
        out.append(_set(spec, "topology.rackLabel", label_key(rng)))
    if rng.random() < 0.15:
        out.append(_set(spec, "topology.nvlinkDomainLabel", label_key(rng)))
    if rng.random() < 0.3:
        out.append(_set(spec, "topology.groupBackend", rng.choice(["StatefulSet", "LeaderWorkerSet"])))
    if rng.random() < 0.15 and "gpuResourceName" not in topo:
        out.append(_set(spec, "topology.gpuResourceName", rng.choice(["nvidia.com/gpu", "example.com/gpu"])))
    return out


MODEL_SPELLINGS = {
    "deepseek-ai/DeepSeek-V3": ["deepseek-ai/deepseek-v3", "deepseek-v3", "deepseek-ai/DeepSeek-V3-0324"],
    "Qwen/Qwen3-30B-A3B": ["qwen/qwen3-30b-a3b", "qwen3-30b-a3b"],
    "Qwen/Qwen3-235B-A22B-FP8": ["qwen/qwen3-235b-a22b-fp8", "qwen3-235b-a22b-fp8"],
}


def _model(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    model = spec["model"]
    if rng.random() < 0.4:
        out.append(_set(spec, "model.name", rng.choice(MODEL_SPELLINGS.get(model["name"], [model["name"]]))))
    if rng.random() < 0.4:
        depth = rng.randint(1, 12)
        out.append(
            _set(spec, "model.path", "/" + "/".join(_word(rng, rng.randint(1, 40)) for _ in range(depth)))
        )
    if rng.random() < 0.4 and "hostPath" not in (model.get("volume") or {}):
        volume = rng.choice(
            [
                {"persistentVolumeClaim": {"claimName": _dns_subdomain(rng, 253), "readOnly": True}},
                {"nfs": {"server": "10.0.0.7", "path": "/export/models", "readOnly": True}},
                {
                    "csi": {
                        "driver": "file.csi.example.com",
                        "readOnly": True,
                        "volumeAttributes": {"share": "m"},
                    }
                },
                {
                    "image": {
                        "reference": "registry.example.com/models/dsv3:fp8",
                        "pullPolicy": "IfNotPresent",
                    }
                },
            ]
        )
        out.append(_set(spec, "model.volume", volume))
    if rng.random() < 0.2:
        out.append(_set(spec, "model.kvCacheDtype", rng.choice(["fp8_e4m3", "fp8_e5m2", "bf16"])))
    return out


def _eplb(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    if rng.random() < 0.5:
        mode = rng.choice(["operator", "engine", "static", "off"])
        out.append(_set(spec, "eplb.mode", mode))
        if mode == "off":
            out.append(_set(spec, "eplb.redundantExperts", 0))
    if rng.random() < 0.3:
        refresh, history = rng.choice([("10s", "1m"), ("5m", "1h"), ("24h", "24h"), ("1h30m", "2h")])
        out.append(_set(spec, "eplb.refreshInterval", refresh))
        out.append(_set(spec, "eplb.history", history))
    if rng.random() < 0.2:
        out.append(_set(spec, "eplb.minInterval", rng.choice(["10s", "24h"])))
    if rng.random() < 0.2:
        out.append(_set(spec, "eplb.maxMovedExpertsPerRefresh", rng.choice([0, 1, 1_000_000])))
    return out


def _monitoring(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    out = []
    if rng.random() < 0.5:
        out.append(_set(spec, "monitoring.podMonitor", rng.random() < 0.6))
        out.append(_set(spec, "monitoring.prometheusRule", rng.random() < 0.6))
    if rng.random() < 0.4:
        labels = {label_key(rng): _word(rng, 63, ALNUM + "-_.") for _ in range(rng.randint(1, 4))}
        labels["release"] = "kube-prometheus-stack"
        out.append(_set(spec, "monitoring.labels", labels))
    if rng.random() < 0.3:
        out.append(_set(spec, "monitoring.minBalancedness", rng.choice([0.0, 0.5, 1.0])))
        out.append(_set(spec, "monitoring.alertFor", rng.choice(["1m", "15m", "24h"])))
    return out


def _kv_transfer(rng: random.Random, spec: dict[str, Any]) -> list[str]:
    if "prefill" not in spec or rng.random() < 0.5:
        return []
    out = [_set(spec, "kvTransfer.backend", rng.choice(["mooncake", "nixl"]))]
    if rng.random() < 0.5:
        devices = [f"mlx5_{i}" for i in range(rng.choice([1, 8, 16]))]
        out.append(_set(spec, "kvTransfer.ibDevices", devices))
    return out


MUTATIONS: tuple[Mutation, ...] = (
    _router,
    _ports,
    _engine,
    _scheduling,
    _model,
    _eplb,
    _monitoring,
    _kv_transfer,
)


def mutate(rng: random.Random, base: Path) -> tuple[dict[str, Any], list[str]]:
    """One MoEDeployment from ``base``: its name, pool shapes, and the other mutations."""
    obj: dict[str, Any] = yaml.safe_load(base.read_text())
    spec = obj["spec"]
    name, style = deployment_name(rng, obj["metadata"]["name"])
    obj["metadata"] = {"name": name}
    mutations = [f"metadata.name={name!r} ({style}, {len(name)} characters)"]
    if rng.random() < 0.3:
        mutations += _hardware(rng, spec)
    mutations += _pools(rng, spec, base.name)
    for mutation in MUTATIONS:
        mutations += mutation(rng, spec)
    mutations += _attention_dp(spec)
    try:
        mutations += _expert_slots(spec)
    except ValueError as exc:  # a shape the spec model refuses: admission will say so
        mutations.append(f"(left as is: {str(exc).splitlines()[0]})")
    return obj, mutations


# --------------------------------------------------------------------------- edge cases

RUNTIME_PORTS = (9400, 9401, 9402)  # moe_contract.pod: the runtime's API, probes and metrics listeners
ROUTER_METRICS_PORT = 29000  # render.shared: the router's --prometheus-port
LONG_LABEL_NAME = "example.com/" + "n" * 64  # the name part one over Kubernetes' 63

Edit = Callable[[dict[str, Any]], None]


def _spec_edit(path: str, value: Any) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        _set(obj["spec"], path, copy.deepcopy(value))

    return edit


def _name_edit(name: str) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        obj["metadata"]["name"] = name

    return edit


def _longest_names(obj: dict[str, Any]) -> None:
    obj["metadata"]["name"] = "n" * MAX_NAME_LENGTH
    obj["spec"]["prefill"]["replicas"] = 256


PD_H100 = "deepseek-v3-pd-h100.yaml"
PD_ROCE = "qwen3-235b-fp8-pd-h200-roce.yaml"  # hostNetwork: container ports are host ports
SINGLE = "qwen3-30b-a3b-single-node.yaml"
GB200 = "deepseek-v3-gb200.yaml"

EDGE_CASES: tuple[tuple[str, str, Edit], ...] = (
    # (what, example, edit)
    ("metadata.name='3fs-moe' (a leading digit: not a DNS-1035 label)", SINGLE, _name_edit("3fs-moe")),
    ("metadata.name='qwen3-30b.v2' (a dot: not a DNS label)", SINGLE, _name_edit("qwen3-30b.v2")),
    (
        f"metadata.name={'n' * MAX_NAME_LENGTH!r} with spec.prefill.replicas=256 (the longest instance name)",
        PD_H100,
        _longest_names,
    ),
    ("spec.engine.port=9400 (the runtime's API port)", SINGLE, _spec_edit("engine.port", RUNTIME_PORTS[0])),
    (
        "spec.engine.port=9401 (the runtime's probe port)",
        PD_ROCE,
        _spec_edit("engine.port", RUNTIME_PORTS[1]),
    ),
    (
        "spec.engine.distInitPort=9402 (the runtime's metrics port)",
        SINGLE,
        _spec_edit("engine.distInitPort", RUNTIME_PORTS[2]),
    ),
    ("spec.kvTransfer.bootstrapPort=9400", PD_H100, _spec_edit("kvTransfer.bootstrapPort", RUNTIME_PORTS[0])),
    (
        "spec.router.port=29000 (the router's metrics port)",
        SINGLE,
        _spec_edit("router.port", ROUTER_METRICS_PORT),
    ),
    (
        "spec.engine.env with NCCL_DEBUG twice",
        PD_H100,
        _spec_edit(
            "engine.env", [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}]
        ),
    ),
    (
        "spec.engine.env fieldRef metadata.labels['rack name'] (not a label key)",
        SINGLE,
        _spec_edit(
            "engine.env",
            [{"name": "RACK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rack name']"}}}],
        ),
    ),
    (
        "spec.engine.resources memory request 2Ti above its limit 1Ti",
        PD_H100,
        _spec_edit("engine.resources", {"requests": {"memory": "2Ti"}, "limits": {"memory": "1Ti"}}),
    ),
    (
        "spec.engine.resources cpu request -1",
        SINGLE,
        _spec_edit("engine.resources", {"requests": {"cpu": "-1"}}),
    ),
    (
        "spec.engine.resources limits gpu: 1 (not a qualified resource name)",
        SINGLE,
        _spec_edit("engine.resources", {"limits": {"gpu": "1"}}),
    ),
    (
        "spec.engine.resources limits example.com/fpga: 0.5 (extended resources are whole numbers)",
        SINGLE,
        _spec_edit("engine.resources", {"limits": {"example.com/fpga": "0.5"}}),
    ),
    (
        "spec.engine.resources requests hugepages-2Mi: 1Gi without a limit",
        SINGLE,
        _spec_edit("engine.resources", {"requests": {"hugepages-2Mi": "1Gi"}}),
    ),
    (
        "spec.router.resources memory request 2Gi above its limit 1Gi",
        SINGLE,
        _spec_edit("router.resources", {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}),
    ),
    ("spec.engine.sharedMemorySize='-1Gi'", SINGLE, _spec_edit("engine.sharedMemorySize", "-1Gi")),
    ("spec.engine.sharedMemorySize='0'", SINGLE, _spec_edit("engine.sharedMemorySize", "0")),
    (
        "spec.topology.tolerations operator Exists with a value",
        PD_H100,
        _spec_edit(
            "topology.tolerations",
            [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "present", "effect": "NoSchedule"}],
        ),
    ),
    (
        "spec.topology.tolerations value of 64 characters",
        PD_H100,
        _spec_edit(
            "topology.tolerations", [{"key": "nvidia.com/gpu", "value": "v" * 64, "effect": "NoSchedule"}]
        ),
    ),
    (
        "spec.topology.nodeSelector value 'nvidia:h100' (not a label value)",
        SINGLE,
        _spec_edit("topology.nodeSelector", {"example.com/gpu": "nvidia:h100"}),
    ),
    (
        "spec.topology.nodeSelector key name of 64 characters",
        SINGLE,
        _spec_edit("topology.nodeSelector", {LONG_LABEL_NAME: "true"}),
    ),
    (
        "spec.topology.rackLabel name of 64 characters",
        PD_H100,
        _spec_edit("topology.rackLabel", LONG_LABEL_NAME),
    ),
    (
        "spec.topology.nvlinkDomainLabel name of 64 characters",
        GB200,
        _spec_edit("topology.nvlinkDomainLabel", LONG_LABEL_NAME),
    ),
    (
        "spec.monitoring.labels key name of 64 characters",
        SINGLE,
        _spec_edit("monitoring.labels", {LONG_LABEL_NAME: "x"}),
    ),
    (
        "spec.topology.gpuResourceName='gpu' (not qualified)",
        SINGLE,
        _spec_edit("topology.gpuResourceName", "gpu"),
    ),
    (
        "spec.topology.rdmaResourceName='rdma_ib' (not qualified)",
        PD_H100,
        _spec_edit("topology.rdmaResourceName", "rdma_ib"),
    ),
    ("spec.model.path='/dev/shm' (the operator mounts it)", SINGLE, _spec_edit("model.path", "/dev/shm")),
    (
        "spec.model.path='/opt/moe-runtime' (the operator mounts it)",
        SINGLE,
        _spec_edit("model.path", "/opt/moe-runtime"),
    ),
    ("spec.model.path='/models/../weights'", SINGLE, _spec_edit("model.path", "/models/../weights")),
    ("spec.model.path='/models:fp8'", SINGLE, _spec_edit("model.path", "/models:fp8")),
    (
        "spec.model.volume persistentVolumeClaim without claimName",
        SINGLE,
        _spec_edit("model.volume", {"persistentVolumeClaim": {"readOnly": True}}),
    ),
)


def generate(seed: int, count: int, namespaces: Sequence[str]) -> list[Generated]:
    """The examples as they are, ``count`` generated specs, then one spec per edge case; examples and
    edge cases in the first and last of ``namespaces``, generated specs in any."""
    out: list[Generated] = []
    for base in EXAMPLES:
        obj = yaml.safe_load(base.read_text())
        out.append(Generated(len(out), "example", base.name, obj, namespaces[0], ("unchanged",)))
    rng = random.Random(seed)
    for i in range(count):
        base = EXAMPLES[i % len(EXAMPLES)]
        obj, mutations = mutate(rng, base)
        out.append(
            Generated(len(out), "generated", base.name, obj, rng.choice(list(namespaces)), tuple(mutations))
        )
    for what, example, edit in EDGE_CASES:
        obj = yaml.safe_load((REPO / "examples" / example).read_text())
        edit(obj)
        out.append(Generated(len(out), "edge", example, obj, namespaces[-1], (f"edge: {what}",)))
    return out
