"""Rules about what users put into the engine pods: model volume, environment, tolerations, host
network, resources.

The platform rules take the platform's policy (validation.platform): the operator creates these
pods under its own ServiceAccount, so what a MoEDeployment may ask for is what the platform
grants tenants, not what the operator could do. Each refusal names the field, says what the
platform allows and how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from moe_contract import pod as P

from ..api.spec import MoEDeploymentSpec
from .platform import NEVER_MODEL_SOURCES, PlatformPolicy, matches, path_problem, protected
from .problem import Problem

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

# Names the operator or the runtime set in every engine container: a second entry would win
# (the last one counts) and break the runtime or SGLang's rendezvous.
RESERVED_ENV: dict[str, str] = {
    "PYTHONPATH": "the operator points it at the runtime's code (/opt/moe-runtime)",
    P.ENV_POD_IP: "the operator sets it from the pod's IP; the runtime binds and rendezvouses on it",
    P.ENV_POD_NAME: "the operator sets it from the pod's name",
    "SGLANG_HOST_IP": "the runtime sets it to the pod's IP for SGLang's rendezvous",
    "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR": "the runtime reads the expert load SGLang records there",
}
RESERVED_ENV_PREFIXES: dict[str, str] = {
    "MOE_": "the operator's and runtime's own settings (rank, role, engine config, placement)",
    "LWS_": "the LeaderWorkerSet controller sets them (group size, worker index, leader address)",
}
_ENV_KEYS = ("name", "value", "valueFrom")
_VALUE_FROM = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
_FIELD_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
)  # fmt: skip
_FIELD_PATH_MAPS = re.compile(r"^metadata\.(labels|annotations)\['[^']+'\]$")
_RESOURCE_FIELDS = re.compile(r"^(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-[0-9A-Za-z]+)$")
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_HOST_PATH_TYPES = ("", "Directory", "File")


def _allowed(patterns: tuple[str, ...]) -> str:
    return ", ".join(patterns) if patterns else "none"


# --------------------------------------------------------------------------- environment


def check_env(spec: MoEDeploymentSpec, policy: PlatformPolicy | None) -> list[Problem]:
    """Every env entry is a Kubernetes EnvVar with a name the runtime does not own, and reads only
    what the platform allows (fieldRef and resourceFieldRef always; ConfigMaps and Secrets by name;
    any name when ``policy`` is None)."""
    problems: list[Problem] = []
    for i, env in enumerate(spec.engine.env):
        where = f"spec.engine.env[{i}]"
        problems += _env_name(where, env.get("name"))
        unknown = [k for k in env if k not in _ENV_KEYS]
        if unknown:
            problems.append(
                Problem(
                    f"{where}.{unknown[0]}",
                    f"{where}.{unknown[0]} is not a field of an environment variable: an entry has a name "
                    "and either value or valueFrom; remove it",
                )
            )
        if "value" in env and "valueFrom" in env:
            problems.append(
                Problem(
                    f"{where}.valueFrom",
                    f"{where} sets both value and valueFrom; keep one of them",
                )
            )
        value = env.get("value")
        if value is not None and not isinstance(value, str):
            problems.append(
                Problem(
                    f"{where}.value",
                    f'{where}.value must be a string, got {value!r}; quote it, as in value: "{value}"',
                )
            )
        if "valueFrom" in env:
            problems += _value_from(f"{where}.valueFrom", env["valueFrom"], policy)
    return problems


def _env_name(where: str, name: Any) -> list[Problem]:
    field = f"{where}.name"
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        return [
            Problem(
                field,
                f"{field} must be an environment variable name (letters, digits, '_', '.', '-', not "
                f"starting with a digit), got {name!r}; give each entry a name, as in "
                "{name: NCCL_DEBUG, value: INFO}",
            )
        ]
    why = RESERVED_ENV.get(name)
    if why is None:
        why = next((w for prefix, w in RESERVED_ENV_PREFIXES.items() if name.startswith(prefix)), None)
    if why is not None:
        return [
            Problem(
                field,
                f"{field}: {name} belongs to the operator ({why}); remove it from spec.engine.env (names "
                f"starting with {' or '.join(RESERVED_ENV_PREFIXES)} and {', '.join(RESERVED_ENV)} are "
                "reserved)",
            )
        ]
    return []


def _value_from(where: str, source: Any, policy: PlatformPolicy | None) -> list[Problem]:
    allowed = "fieldRef, resourceFieldRef, or configMapKeyRef/secretKeyRef of a name the platform allows"
    if not isinstance(source, Mapping) or len(source) != 1 or next(iter(source)) not in _VALUE_FROM:
        keys = ", ".join(source) if isinstance(source, Mapping) else repr(source)
        return [Problem(where, f"{where} must name exactly one source ({allowed}), got {keys or 'none'}")]
    kind, ref = next(iter(source.items()))
    field = f"{where}.{kind}"
    if not isinstance(ref, Mapping):
        return [Problem(field, f"{field} must be an object; give it the fields Kubernetes defines")]
    if kind == "fieldRef":
        path = ref.get("fieldPath")
        if not isinstance(path, str) or not (path in _FIELD_PATHS or _FIELD_PATH_MAPS.match(path)):
            return [
                Problem(
                    f"{field}.fieldPath",
                    f"{field}.fieldPath {path!r} is not a pod field the kubelet can expose; use one of "
                    f"{', '.join(_FIELD_PATHS)}, metadata.labels['KEY'] or metadata.annotations['KEY']",
                )
            ]
        return []
    if kind == "resourceFieldRef":
        resource = ref.get("resource")
        problems = []
        if not isinstance(resource, str) or not _RESOURCE_FIELDS.match(resource):
            problems.append(
                Problem(
                    f"{field}.resource",
                    f"{field}.resource {resource!r} is not a container resource; use limits.cpu, "
                    "limits.memory, requests.cpu, requests.memory or their ephemeral-storage forms",
                )
            )
        if ref.get("containerName") not in (None, "engine"):
            problems.append(
                Problem(
                    f"{field}.containerName",
                    f"{field}.containerName must be engine (the only container of an engine pod) or unset",
                )
            )
        return problems
    name = ref.get("name")
    secret = kind == "secretKeyRef"
    noun, knob = ("Secret", "envSecretNames") if secret else ("ConfigMap", "envConfigMapNames")
    if not isinstance(name, str) or not isinstance(ref.get("key"), str):
        return [Problem(field, f"{field} needs a name and a key (strings): the {noun} and its entry to read")]
    if policy is None:
        return []
    patterns = policy.env_secret_names if secret else policy.env_config_map_names
    if matches(patterns, name):
        return []
    return [
        Problem(
            f"{field}.name",
            f"{field}.name: {noun} {name!r} is not one the platform lets engine pods read (the kubelet "
            f"reads it for the pod, whatever its author may read); allowed {noun} names: "
            f"{_allowed(patterns)} (platform.{knob}). Use an allowed {noun}, or a plain value",
        )
    ]


# --------------------------------------------------------------------------- model volume


def check_kernel_cache(spec: MoEDeploymentSpec, policy: PlatformPolicy) -> list[Problem]:
    """spec.engine.kernelCacheClaim mounts a PersistentVolumeClaim read-write: only where the platform
    allows claims as volume sources."""
    if not spec.engine.kernel_cache_claim or "persistentVolumeClaim" in policy.model_volume_sources:
        return []
    return [
        Problem(
            "spec.engine.kernelCacheClaim",
            "spec.engine.kernelCacheClaim: the platform does not allow persistentVolumeClaim volumes "
            "(platform.modelVolumeSources); remove it",
        )
    ]


def check_model_volume(spec: MoEDeploymentSpec, policy: PlatformPolicy) -> list[Problem]:
    """spec.model.volume uses a source the platform allows; hostPath only under its prefixes."""
    volume = spec.model.volume
    if volume is None:
        return []
    problems: list[Problem] = []
    if "name" in volume:
        problems.append(
            Problem(
                "spec.model.volume.name",
                "spec.model.volume.name: the operator names the volume itself (model); remove name",
            )
        )
    allowed = _volume_offer(policy)
    for source, value in volume.items():
        if source == "name" or value is None:
            continue
        field = f"spec.model.volume.{source}"
        if source == "hostPath":
            problems += _host_path(field, value, policy)
        elif source not in policy.model_volume_sources:
            why = NEVER_MODEL_SOURCES.get(source)
            reason = f" ({why})" if why else ""
            problems.append(
                Problem(
                    field,
                    f"{field}: {source} volumes are not allowed for model weights{reason}; the platform "
                    f"allows {allowed}",
                )
            )
        elif not isinstance(value, Mapping):
            problems.append(
                Problem(field, f"{field} must be an object (a Kubernetes {source} volume source)")
            )
    return problems


def _volume_offer(policy: PlatformPolicy) -> str:
    sources = ", ".join(policy.model_volume_sources) or "no volume source"
    prefixes = ", ".join(policy.host_path_prefixes)
    host = f", or hostPath under {prefixes}" if prefixes else " (hostPath: none; platform.hostPathPrefixes)"
    return sources + host


def _host_path(field: str, value: Any, policy: PlatformPolicy) -> list[Problem]:
    if not isinstance(value, Mapping) or not isinstance(value.get("path"), str):
        return [Problem(f"{field}.path", f"{field}.path is required: the host directory holding the weights")]
    path: str = value["path"]
    where = f"{field}.path"
    prefixes = ", ".join(policy.host_path_prefixes) or "none"
    fix = f"host paths the platform allows lie under: {prefixes} (platform.hostPathPrefixes)"
    bad = path_problem(path)
    if bad:
        return [Problem(where, f"{where} {path!r} {bad}; write it plainly, such as /raid/models/DeepSeek-V3")]
    guarded = protected(path)
    if guarded is not None:
        return [
            Problem(
                where,
                f"{where} {path!r} reaches {guarded}, which no engine pod may mount (node system, kubelet "
                f"or container runtime state and sockets); {fix}",
            )
        ]
    problems: list[Problem] = []
    if policy.host_path_prefix_of(path) is None:
        problems.append(Problem(where, f"{where} {path!r} is not a host path the platform allows; {fix}"))
    kind = value.get("type", "")
    if kind not in _HOST_PATH_TYPES:
        problems.append(
            Problem(
                f"{field}.type",
                f"{field}.type {kind!r} is not allowed: the weights must already be on the node; use "
                "Directory or File (or leave it unset)",
            )
        )
    return problems


# --------------------------------------------------------------------------- scheduling, network


def check_tolerations(spec: MoEDeploymentSpec, policy: PlatformPolicy) -> list[Problem]:
    """Engine pods tolerate only the taints the platform lists (its GPU taints by default)."""
    problems: list[Problem] = []
    keys = _allowed(policy.toleration_keys)
    for i, toleration in enumerate(spec.topology.tolerations):
        field = f"spec.topology.tolerations[{i}]"
        unknown = [k for k in toleration if k not in _TOLERATION_KEYS]
        if unknown:
            problems.append(
                Problem(
                    f"{field}.{unknown[0]}",
                    f"{field}.{unknown[0]} is not a toleration field; use key, operator, value, effect and "
                    "tolerationSeconds",
                )
            )
            continue
        key, operator = toleration.get("key", ""), toleration.get("operator", "Equal")
        if operator not in ("Equal", "Exists"):
            problems.append(Problem(f"{field}.operator", f"{field}.operator must be Equal or Exists"))
        if not key:
            problems.append(
                Problem(
                    f"{field}.key",
                    f"{field} has no key, so it tolerates every taint (the platform's reserved and "
                    f"control-plane nodes too); name a taint the platform allows: {keys} "
                    "(platform.tolerationKeys)",
                )
            )
        elif key not in policy.toleration_keys:
            problems.append(
                Problem(
                    f"{field}.key",
                    f"{field}.key {key!r} is not a taint the platform lets engine pods tolerate; allowed "
                    f"taint keys: {keys} (platform.tolerationKeys): remove it or ask the platform team",
                )
            )
        effect = toleration.get("effect", "")
        if effect not in _EFFECTS:
            problems.append(
                Problem(
                    f"{field}.effect", f"{field}.effect must be NoSchedule, PreferNoSchedule or NoExecute"
                )
            )
        seconds = toleration.get("tolerationSeconds")
        if seconds is not None and (effect != "NoExecute" or not isinstance(seconds, int) or seconds < 0):
            problems.append(
                Problem(
                    f"{field}.tolerationSeconds",
                    f"{field}.tolerationSeconds needs effect NoExecute and a whole number of seconds >= 0",
                )
            )
    return problems


def check_host_network(
    spec: MoEDeploymentSpec, policy: PlatformPolicy, namespace: str | None
) -> list[Problem]:
    """Host networking only in the namespaces the platform grants it to."""
    if not spec.topology.host_network or policy.allows_host_network(namespace):
        return []
    where = f"namespace {namespace!r}" if namespace is not None else "this manifest (no namespace given)"
    return [
        Problem(
            "spec.topology.hostNetwork",
            f"spec.topology.hostNetwork: the platform does not allow host networking in {where} (it puts "
            "the pod on the node's network, beside its agents); allowed in: "
            f"{_allowed(policy.host_network_namespaces)} (platform.hostNetworkNamespaces). Set hostNetwork "
            "to false, or ask the platform team to grant it to this namespace",
        )
    ]


# --------------------------------------------------------------------------- resources


def check_resources(spec: MoEDeploymentSpec) -> list[Problem]:
    """The GPU count comes from spec.topology, never from engine.resources."""
    gpu = spec.topology.gpu_resource_name
    resources = spec.engine.resources or {}
    problems: list[Problem] = []
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict) and gpu in values:
            problems.append(
                Problem(
                    f"spec.engine.resources.{section}",
                    f"spec.engine.resources.{section} must not set {gpu}: every engine pod gets all "
                    f"spec.topology.gpusPerNode GPUs of its node; remove it and set gpusPerNode instead",
                )
            )
    return problems
