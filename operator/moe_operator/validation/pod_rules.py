"""Rules about what users put into the engine pods: model volume, environment, tolerations, host
network, resources.

The platform rules take the platform's policy (validation.platform): the operator creates these
pods under its own ServiceAccount, so what a MoEDeployment may ask for is what the platform
grants tenants, not what the operator could do. Each refusal names the field, says what the
platform allows and how to fix it.

The same rules hold these fields to what the Kubernetes API server accepts in the pods the
operator renders from them (its pkg/apis/core/validation: names, quantities, keys, mount paths):
a spec admitted here never turns into a StatefulSet, LeaderWorkerSet or Deployment, or a pod of
one, that the API server refuses.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from moe_contract import pod as P

from ..api.spec import MoEDeploymentSpec
from ..api.types import parse_quantity
from ..recipe.derive import KERNEL_CACHE_DIR
from .platform import NEVER_MODEL_SOURCES, PlatformPolicy, matches, path_problem, protected, under
from .problem import Problem

_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")

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
_FIELD_PATH_MAPS = re.compile(r"metadata\.(labels|annotations)\['(.*)'\]")
_RESOURCE_FIELDS = re.compile(r"(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-[0-9A-Za-z]+)")
# resourceFieldRef divisors the API server takes (by their canonical spelling).
_CPU_DIVISORS = ("1m", "1")
_BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_HOST_PATH_TYPES = ("", "Directory", "File")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_CSI_DRIVER = re.compile(r"[a-zA-Z0-9][-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9]")

# Kubernetes names (k8s.io/apimachinery/pkg/util/validation).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_MAP_KEY = re.compile(r"[A-Za-z0-9_-]+")

SHM_DIR = "/dev/shm"
"""Where render.group mounts each engine pod's memory-backed emptyDir (spec.engine.sharedMemorySize)."""


def _allowed(patterns: tuple[str, ...]) -> str:
    return ", ".join(patterns) if patterns else "none"


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (label or annotation key, taint key, resource
    name), or None: an optional DNS-subdomain prefix of at most 253 characters and '/', then a name
    of 1 to 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit."""
    if key.count("/") > 1:
        return "has more than one '/'"
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return (
            f"has a prefix {prefix!r} that is not a DNS subdomain (lowercase letters, digits, '-' and "
            "'.', at most 253 characters)"
        )
    if len(name) > 63 or not _NAME_PART.fullmatch(name):
        return (
            f"has a name part {name!r} that is not 1 to 63 letters, digits, '-', '_' or '.' starting "
            "and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value (also a taint's value), or None."""
    if len(value) > 63 or (value and not _NAME_PART.fullmatch(value)):
        return (
            "is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit, or empty)"
        )
    return None


def _key_field(base: str, key: Any) -> str:
    """The JSON path of a map entry: base.cpu, or base['example.com/fpga'] for keys with dots."""
    text = str(key)
    return f"{base}.{text}" if _MAP_KEY.fullmatch(text) else f"{base}['{text}']"


def _quantity(value: Any) -> Decimal | None:
    """The number a Kubernetes quantity (string, integer or YAML float) stands for, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        amount = parse_quantity(repr(value) if isinstance(value, float) else value)
    except (ValueError, ArithmeticError):  # decimal.InvalidOperation is an ArithmeticError
        return None
    return amount if amount.is_finite() else None


# --------------------------------------------------------------------------- environment


def check_env(spec: MoEDeploymentSpec, policy: PlatformPolicy | None) -> list[Problem]:
    """Every env entry is a Kubernetes EnvVar with a name the runtime does not own and no other
    entry has, and reads only what the platform allows (fieldRef and resourceFieldRef always;
    ConfigMaps and Secrets by name; any name when ``policy`` is None)."""
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
    return problems + _repeated_env(spec.engine.env)


def _env_name(where: str, name: Any) -> list[Problem]:
    field = f"{where}.name"
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
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


def _repeated_env(env: list[dict[str, Any]]) -> list[Problem]:
    """One entry per name: a LeaderWorkerSet's pod template with two is refused (a StatefulSet's
    only draws a warning, and the last entry wins)."""
    first: dict[str, int] = {}
    problems: list[Problem] = []
    for i, entry in enumerate(env):
        name = entry.get("name")
        if not isinstance(name, str):
            continue
        if name not in first:
            first[name] = i
            continue
        field = f"spec.engine.env[{i}].name"
        problems.append(
            Problem(
                field,
                f"{field}: {name} is already set by spec.engine.env[{first[name]}]; Kubernetes refuses "
                "two environment variables of one name in a LeaderWorkerSet's pods; keep one of them",
            )
        )
    return problems


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
        return _field_ref(field, ref)
    if kind == "resourceFieldRef":
        return _resource_field_ref(field, ref)
    return _key_ref(field, kind, ref, policy)


def _field_ref(field: str, ref: Mapping[str, Any]) -> list[Problem]:
    """A pod field the kubelet exposes; a label or annotation by a key Kubernetes accepts."""
    path = ref.get("fieldPath")
    keyed = _FIELD_PATH_MAPS.fullmatch(path) if isinstance(path, str) else None
    if keyed is None and path not in _FIELD_PATHS:
        return [
            Problem(
                f"{field}.fieldPath",
                f"{field}.fieldPath {path!r} is not a pod field the kubelet can expose; use one of "
                f"{', '.join(_FIELD_PATHS)}, metadata.labels['KEY'] or metadata.annotations['KEY']",
            )
        ]
    problems: list[Problem] = []
    if keyed is not None:
        kind, key = keyed.groups()
        # The API server reads annotation keys case-insensitively (it lowercases them first).
        bad = qualified_name_problem(key.lower() if kind == "annotations" else key)
        if bad is not None:
            problems.append(
                Problem(
                    f"{field}.fieldPath",
                    f"{field}.fieldPath {path!r}: the {kind[:-1]} key {key!r} {bad}; use the pod's "
                    f"{kind[:-1]} key as Kubernetes writes it, such as metadata.{kind}['example.com/rack']",
                )
            )
    if ref.get("apiVersion", "v1") != "v1":
        problems.append(
            Problem(
                f"{field}.apiVersion",
                f"{field}.apiVersion {ref.get('apiVersion')!r} is not the pod's API version; set v1 or "
                "remove it",
            )
        )
    return problems


def _resource_field_ref(field: str, ref: Mapping[str, Any]) -> list[Problem]:
    resource = ref.get("resource")
    problems = []
    if not isinstance(resource, str) or not _RESOURCE_FIELDS.fullmatch(resource):
        problems.append(
            Problem(
                f"{field}.resource",
                f"{field}.resource {resource!r} is not a container resource; use limits.cpu, "
                "limits.memory, requests.cpu, requests.memory or their ephemeral-storage forms",
            )
        )
    else:
        problems += _divisor(field, resource, ref.get("divisor"))
    if ref.get("containerName") not in (None, "engine"):
        problems.append(
            Problem(
                f"{field}.containerName",
                f"{field}.containerName must be engine (the only container of an engine pod) or unset",
            )
        )
    return problems


def _divisor(field: str, resource: str, divisor: Any) -> list[Problem]:
    """The API server takes 1m or 1 for CPU, 1 or a power-of-1000 or -1024 unit for bytes."""
    if divisor is None or _quantity(divisor) == 0:
        return []
    allowed = _CPU_DIVISORS if resource.endswith(".cpu") else _BYTE_DIVISORS
    if str(divisor) in allowed:
        return []
    return [
        Problem(
            f"{field}.divisor",
            f"{field}.divisor {divisor!r} is not a divisor Kubernetes takes for {resource}; use one of "
            f"{', '.join(allowed)}, or remove it",
        )
    ]


def _key_ref(field: str, kind: str, ref: Mapping[str, Any], policy: PlatformPolicy | None) -> list[Problem]:
    """configMapKeyRef/secretKeyRef: a well-formed name and key, of a ConfigMap or Secret the
    platform lets engine pods read."""
    name, key = ref.get("name"), ref.get("key")
    secret = kind == "secretKeyRef"
    noun, knob = ("Secret", "envSecretNames") if secret else ("ConfigMap", "envConfigMapNames")
    if not isinstance(name, str) or not isinstance(key, str):
        return [Problem(field, f"{field} needs a name and a key (strings): the {noun} and its entry to read")]
    problems: list[Problem] = []
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        problems.append(
            Problem(
                f"{field}.name",
                f"{field}.name {name!r} is not a {noun} name (lowercase letters, digits, '-' and '.', at "
                f"most 253 characters); use the {noun}'s name",
            )
        )
    if len(key) > 253 or not _CONFIG_KEY.fullmatch(key) or key == "." or key.startswith(".."):
        problems.append(
            Problem(
                f"{field}.key",
                f"{field}.key {key!r} is not a {noun} key (letters, digits, '-', '_' and '.', at most "
                f"253 characters, not . or starting with ..); use the key of the {noun} entry to read",
            )
        )
    if problems or policy is None:
        return problems
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
    """spec.model.volume uses a source the platform allows, with the fields Kubernetes requires of
    it; hostPath only under the platform's prefixes; mounted at a spec.model.path clear of the
    operator's own mounts."""
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
        else:
            problems += _source_fields(field, source, value)
    return problems + _model_mount(spec)


def _volume_offer(policy: PlatformPolicy) -> str:
    sources = ", ".join(policy.model_volume_sources) or "no volume source"
    prefixes = ", ".join(policy.host_path_prefixes)
    host = f", or hostPath under {prefixes}" if prefixes else " (hostPath: none; platform.hostPathPrefixes)"
    return sources + host


# What the API server requires of each default volume source: (field, what to set it to).
_REQUIRED_SOURCE_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "persistentVolumeClaim": (("claimName", "the name of the claim holding the weights, such as models"),),
    "nfs": (("server", "the NFS server, such as 10.0.0.7"), ("path", "the export, such as /export/models")),
    "csi": (("driver", "the CSI driver's name, such as file.csi.example.com"),),
    "image": (("reference", "the OCI image holding the weights, such as registry.example.com/models/dsv3"),),
}


def _source_fields(field: str, source: str, value: Mapping[str, Any]) -> list[Problem]:
    """The required fields of a persistentVolumeClaim, nfs, csi or image source, and their forms."""
    problems = [
        Problem(f"{field}.{key}", f"{field}.{key} is required: set it to {what}")
        for key, what in _REQUIRED_SOURCE_FIELDS.get(source, ())
        if not isinstance(value.get(key), str) or not value[key]
    ]
    if problems:
        return problems
    if source == "nfs" and not value["path"].startswith("/"):
        problems.append(
            Problem(
                f"{field}.path",
                f"{field}.path {value['path']!r} must be an absolute path; use the export as the NFS "
                "server names it, such as /export/models",
            )
        )
    if source == "csi" and not _CSI_DRIVER.fullmatch(value["driver"]):
        problems.append(
            Problem(
                f"{field}.driver",
                f"{field}.driver {value['driver']!r} is not a CSI driver name (2 to 63 letters, digits, '-', "
                "'_' or '.', starting and ending with a letter or digit); use the driver's registered name",
            )
        )
    if source == "image" and value.get("pullPolicy") not in (None, "", *_PULL_POLICIES):
        problems.append(
            Problem(
                f"{field}.pullPolicy",
                f"{field}.pullPolicy {value.get('pullPolicy')!r} is not a pull policy; use "
                f"{', '.join(_PULL_POLICIES)}, or remove it",
            )
        )
    return problems


def _operator_mounts(spec: MoEDeploymentSpec) -> dict[str, str]:
    """The directories the operator mounts in every engine container (render.group), and what."""
    mounts = {
        SHM_DIR: "the pod's shared memory (spec.engine.sharedMemorySize)",
        P.RUNTIME_DIR: "the runtime's code",
        P.ENGINE_CONFIG_DIR: "the engine configuration",
        P.PLACEMENT_DIR: "the expert placement",
        P.TOKEN_DIR: "the runtime's token digests",
    }
    if spec.engine.kernel_cache_claim:
        mounts[KERNEL_CACHE_DIR] = "the kernel cache (spec.engine.kernelCacheClaim)"
    return mounts


def _model_mount(spec: MoEDeploymentSpec) -> list[Problem]:
    """The model volume's mount path is none of the operator's, nor above or below one: Kubernetes
    refuses two mounts at one path, and a mount inside another hides it or cannot be made."""
    path = spec.model.path
    if spec.model.volume is None or not path:
        return []
    mount = posixpath.normpath("/" + path.lstrip("/"))
    for target, what in _operator_mounts(spec).items():
        if mount == target:
            relation = "is"
        elif under(mount, target):
            relation = "lies under"
        elif under(target, mount):
            relation = "contains"
        else:
            continue
        return [
            Problem(
                "spec.model.path",
                f"spec.model.path {path!r} {relation} {target}, where the operator mounts {what} in every "
                "engine container (the weights' volume is mounted at spec.model.path); use a directory "
                "of its own, such as /models/" + spec.model.name.rsplit("/", 1)[-1].lower(),
            )
        ]
    return []


def _host_path(field: str, value: Any, policy: PlatformPolicy) -> list[Problem]:
    prefixes = ", ".join(policy.host_path_prefixes) or "none"
    if not isinstance(value, Mapping) or not isinstance(value.get("path"), str):
        return [
            Problem(
                f"{field}.path",
                f"{field}.path is required: set it to the host directory holding the weights, under "
                f"{prefixes} (platform.hostPathPrefixes)",
            )
        ]
    path: str = value["path"]
    where = f"{field}.path"
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
    """Engine pods tolerate only the taints the platform lists (its GPU taints by default), each
    toleration as Kubernetes takes it."""
    problems: list[Problem] = []
    for i, toleration in enumerate(spec.topology.tolerations):
        problems += _toleration(f"spec.topology.tolerations[{i}]", toleration, policy)
    return problems


def _toleration(field: str, toleration: Mapping[str, Any], policy: PlatformPolicy) -> list[Problem]:
    unknown = [k for k in toleration if k not in _TOLERATION_KEYS]
    if unknown:
        return [
            Problem(
                f"{field}.{unknown[0]}",
                f"{field}.{unknown[0]} is not a toleration field; use key, operator, value, effect and "
                "tolerationSeconds",
            )
        ]
    return [
        *_toleration_key(field, toleration.get("key", ""), policy),
        *_toleration_value(field, toleration),
        *_toleration_effect(field, toleration),
    ]


def _toleration_key(field: str, key: Any, policy: PlatformPolicy) -> list[Problem]:
    keys = _allowed(policy.toleration_keys)
    if not key:
        return [
            Problem(
                f"{field}.key",
                f"{field} has no key, so it tolerates every taint (the platform's reserved and "
                f"control-plane nodes too); name a taint the platform allows: {keys} "
                "(platform.tolerationKeys)",
            )
        ]
    bad = qualified_name_problem(key) if isinstance(key, str) else "is not a string"
    if bad is not None:
        return [
            Problem(
                f"{field}.key",
                f"{field}.key {key!r} is not a taint key: it {bad}; use a taint the platform allows: "
                f"{keys} (platform.tolerationKeys)",
            )
        ]
    if key not in policy.toleration_keys:
        return [
            Problem(
                f"{field}.key",
                f"{field}.key {key!r} is not a taint the platform lets engine pods tolerate; allowed "
                f"taint keys: {keys} (platform.tolerationKeys): remove it or ask the platform team",
            )
        ]
    return []


def _toleration_value(field: str, toleration: Mapping[str, Any]) -> list[Problem]:
    """Equal (the default) matches a taint's value, a label value; Exists matches any, so no value."""
    operator, value = toleration.get("operator", "Equal"), toleration.get("value", "")
    if operator not in ("Equal", "Exists", ""):
        return [Problem(f"{field}.operator", f"{field}.operator must be Equal or Exists; use one of them")]
    if not isinstance(value, str):
        return [
            Problem(f"{field}.value", f'{field}.value must be a string, got {value!r}; quote it: "{value}"')
        ]
    if operator == "Exists" and value:
        return [
            Problem(
                f"{field}.value",
                f"{field}.value must be empty with operator Exists (which matches every value of the "
                "taint); remove value, or use operator Equal",
            )
        ]
    bad = label_value_problem(value)
    if bad is not None:
        return [Problem(f"{field}.value", f"{field}.value {value!r} {bad}; use the taint's value")]
    return []


def _toleration_effect(field: str, toleration: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    effect = toleration.get("effect", "")
    if effect not in _EFFECTS:
        problems.append(
            Problem(
                f"{field}.effect",
                f"{field}.effect must be NoSchedule, PreferNoSchedule or NoExecute; use one of them, or "
                "leave it unset for every effect",
            )
        )
    seconds = toleration.get("tolerationSeconds")
    whole = isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0
    if seconds is not None and (effect != "NoExecute" or not whole):
        problems.append(
            Problem(
                f"{field}.tolerationSeconds",
                f"{field}.tolerationSeconds needs effect NoExecute and a whole number of seconds (0 or "
                "more); set both, or remove tolerationSeconds",
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

_RESOURCE_SECTIONS = ("limits", "requests")
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_HUGEPAGES = "hugepages-"
_NATIVE_PREFIX = "kubernetes.io/"


def check_resources(spec: MoEDeploymentSpec) -> list[Problem]:
    """The GPU count (and RDMA device) come from spec.topology, never from engine.resources; the
    engine's and the router's resources and the engine's /dev/shm size are what Kubernetes takes
    in a container."""
    topo = spec.topology
    devices = (topo.gpu_resource_name, *([topo.rdma_resource_name] if topo.rdma_resource_name else []))
    return [
        *_engine_devices(spec),
        # The operator adds default cpu and memory requests to the engine container (render
        # .engine_container), never where the spec requests or limits them: no default can exceed
        # a limit of the spec's.
        *_requirements("spec.engine.resources", spec.engine.resources, skip=devices, has_cpu_memory=True),
        # The router container takes spec.router.resources as they are (defaults only when unset).
        *_requirements("spec.router.resources", spec.router.resources, skip=(), has_cpu_memory=False),
        *_shared_memory(spec),
    ]


def _engine_devices(spec: MoEDeploymentSpec) -> list[Problem]:
    topo = spec.topology
    resources = spec.engine.resources or {}
    problems: list[Problem] = []
    for section in _RESOURCE_SECTIONS:
        values = resources.get(section)
        if not isinstance(values, Mapping):
            continue
        field = f"spec.engine.resources.{section}"
        if topo.gpu_resource_name in values:
            problems.append(
                Problem(
                    field,
                    f"{field} must not set {topo.gpu_resource_name}: every engine pod gets all "
                    f"spec.topology.gpusPerNode GPUs of its node; remove it and set gpusPerNode instead",
                )
            )
        if topo.rdma_resource_name and topo.rdma_resource_name in values:
            problems.append(
                Problem(
                    field,
                    f"{field} must not set {topo.rdma_resource_name}: the operator gives every engine pod "
                    "one RDMA device of spec.topology.rdmaResourceName; remove it",
                )
            )
    return problems


Amounts = dict[str, tuple[Any, Decimal]]
"""Resource name -> (the spec's value, the number it stands for)."""


def _requirements(
    where: str, resources: Mapping[str, Any] | None, skip: tuple[str, ...], has_cpu_memory: bool
) -> list[Problem]:
    """A container's ResourceRequirements as the API server checks them: known names, quantities of
    0 or more (whole for extended resources, whole pages for hugepages), requests within limits
    (equal to them for hugepages and extended resources, which Kubernetes never overcommits).
    ``has_cpu_memory``: the operator requests cpu and memory in this container whatever the spec
    says (hugepages need one of them)."""
    if not resources:
        return []
    problems = [
        Problem(
            f"{where}.{key}",
            f"{where}.{key} is not a field of resources; use limits and requests"
            + (" (the operator sets the pod's resource claims itself)" if key == "claims" else ""),
        )
        for key in resources
        if key not in _RESOURCE_SECTIONS
    ]
    amounts: dict[str, Amounts] = {}
    for section in _RESOURCE_SECTIONS:
        amounts[section], bad = _amounts(f"{where}.{section}", resources.get(section), skip)
        problems += bad
    problems += _requests_within_limits(where, amounts["requests"], amounts["limits"])
    if not has_cpu_memory:
        problems += _hugepages_alone(where, amounts)
    return problems


def _amounts(field: str, values: Any, skip: tuple[str, ...]) -> tuple[Amounts, list[Problem]]:
    if values is None:
        return {}, []
    if not isinstance(values, Mapping):
        return {}, [
            Problem(field, f'{field} must map resource names to quantities; use one such as {{cpu: "8"}}')
        ]
    found: Amounts = {}
    problems: list[Problem] = []
    for name, value in values.items():
        if name in skip:
            continue
        where = _key_field(field, name)
        bad = _resource_name_problem(name) or _amount_problem(name, value)
        if bad is not None:
            problems.append(Problem(where, f"{where}: {bad}"))
            continue
        amount = _quantity(value)
        assert amount is not None  # _amount_problem refuses the rest
        found[name] = (value, amount)
    return found, problems


def _native(name: str) -> bool:
    return "/" not in name or _NATIVE_PREFIX in name


def _overcommittable(name: str) -> bool:
    """Whether a request may lie below its limit (cpu, memory, ephemeral-storage), unlike hugepages
    and extended resources (example.com/fpga), whose request must equal their limit."""
    return _native(name) and not name.startswith(_HUGEPAGES)


def _page_size(name: str) -> Decimal | None:
    """The page size of hugepages-<size>, when it is a positive whole number of bytes."""
    size = _quantity(name.removeprefix(_HUGEPAGES))
    return size if size is not None and size > 0 and size == size.to_integral_value() else None


def _resource_name_problem(name: Any) -> str | None:
    fix = (
        "a container asks for cpu, memory, ephemeral-storage, hugepages-<size> (such as hugepages-2Mi) "
        "or an extended resource named with a domain, such as example.com/fpga; use one of them"
    )
    if not isinstance(name, str):
        return f"{name!r} is not a resource name: {fix}"
    bad = qualified_name_problem(name)
    if bad is None and "/" not in name and name not in _STANDARD_RESOURCES:
        if not name.startswith(_HUGEPAGES):
            bad = "is not a standard container resource"
        elif _page_size(name) is None:
            bad = "does not name a page size"
    if bad is None and not _native(name):
        quota = qualified_name_problem("requests." + name)  # its ResourceQuota name must be valid too
        if name.startswith("requests.") or quota is not None:
            bad = f"is not an extended resource name (as requests.{name}, its quota name, it {quota})"
    return None if bad is None else f"{name!r} {bad}: {fix}"


def _amount_problem(name: str, value: Any) -> str | None:
    amount = _quantity(value)
    if amount is None:
        return f"{value!r} is not a Kubernetes quantity; use one such as 8, 500m or 64Gi"
    if amount < 0:
        return f"{value!r} is negative; use a quantity of 0 or more"
    if not _native(name) and amount != amount.to_integral_value():
        return (
            f"{value!r} is not a whole number: {name} is an extended resource, counted in whole "
            "devices; use a whole number"
        )
    page = _page_size(name) if name.startswith(_HUGEPAGES) else None
    if page is not None and math.ceil(amount) % page:
        return (
            f"{value!r} is not a whole number of {name.removeprefix(_HUGEPAGES)} pages; use a multiple of it"
        )
    return None


def _requests_within_limits(where: str, requests: Amounts, limits: Amounts) -> list[Problem]:
    problems: list[Problem] = []
    for name, (request, amount) in requests.items():
        field = _key_field(f"{where}.requests", name)
        if name not in limits:
            if not _overcommittable(name):
                limit_field = _key_field(f"{where}.limits", name)
                problems.append(
                    Problem(
                        limit_field,
                        f"{limit_field} is required with {field}: Kubernetes never overcommits {name}, "
                        f"so it needs a limit equal to the request; set limits {name}: {request}",
                    )
                )
            continue
        limit, most = limits[name]
        if not _overcommittable(name) and amount != most:
            problems.append(
                Problem(
                    field,
                    f"{field} ({request}) must equal its limit ({limit}): Kubernetes never overcommits "
                    f"{name}; set both to the same quantity",
                )
            )
        elif amount > most:
            problems.append(
                Problem(
                    field,
                    f"{field} ({request}) is above its limit ({limit}); lower the request or raise "
                    f"limits {name}",
                )
            )
    return problems


def _hugepages_alone(where: str, amounts: dict[str, Amounts]) -> list[Problem]:
    names = {name for section in amounts.values() for name in section}
    if not any(n.startswith(_HUGEPAGES) for n in names) or names & {"cpu", "memory"}:
        return []
    return [
        Problem(
            where,
            f"{where} asks for hugepages without cpu or memory, which Kubernetes requires beside them; "
            "add requests memory (or cpu)",
        )
    ]


def _shared_memory(spec: MoEDeploymentSpec) -> list[Problem]:
    """/dev/shm is an emptyDir in memory: its size a positive quantity (NCCL and DeepEP need room)."""
    size = spec.engine.shared_memory_size
    amount = _quantity(size)
    if amount is not None and amount > 0:
        return []
    field = "spec.engine.sharedMemorySize"
    return [
        Problem(
            field,
            f"{field} {size!r} must be a positive size: it bounds each engine pod's memory-backed "
            "/dev/shm, where NCCL and DeepEP keep their buffers (Kubernetes refuses a negative size and "
            "0 leaves the size to the node); set one such as 64Gi",
        )
    ]
