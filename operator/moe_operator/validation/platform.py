"""What the platform lets tenants put into the pods the operator creates for them.

Whoever may create a MoEDeployment gets pods that the operator's ServiceAccount creates for
them. Without limits that author could mount any host directory, read any Secret of the
namespace through ``env``, tolerate every taint or join the node's network: node root or the
namespace's secrets, whatever their own RBAC says. The platform team sets the limits once
(chart values ``platform.*`` -> `moe-operator run` flags, or a file); one ``PlatformPolicy``
drives the webhook, the reconciler's check and `moe-operator crds validate --policy`, and
``to_params`` gives the same limits to the ValidatingAdmissionPolicy that backs them up
(policies/admission/operator-pods.yaml).

Name patterns (namespaces, Secrets, ConfigMaps) are exact names, a prefix ending in ``*``
(``hf-token*``) or ``*`` alone; the admission policy's CEL reads them the same way.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

DEFAULT_VOLUME_SOURCES = ("persistentVolumeClaim", "csi", "nfs", "image")

# Volume sources a platform may allow for model weights: the Pod API's VolumeSource fields less
# the ones below, which have their own knob or project API data into the pod.
VOLUME_SOURCES = frozenset(
    {
        *DEFAULT_VOLUME_SOURCES,
        "ephemeral", "emptyDir", "iscsi", "fc", "rbd", "cephfs", "cinder", "azureDisk", "azureFile",
        "awsElasticBlockStore", "gcePersistentDisk", "glusterfs", "portworxVolume", "quobyte",
        "scaleIO", "storageos", "vsphereVolume", "photonPersistentDisk", "flocker", "flexVolume",
    }
)  # fmt: skip
NEVER_MODEL_SOURCES = {
    "hostPath": "hostPath is governed by hostPathPrefixes",
    "secret": "a Secret is not model weights; reference allowed Secrets from env instead",
    "configMap": "a ConfigMap is not model weights",
    "projected": "projected volumes mount ServiceAccount tokens and API data",
    "downwardAPI": "the downward API is not model weights",
    "gitRepo": "gitRepo runs git on the node as root and is deprecated",
}

# Host directories no hostPath may reach, whatever the platform configures: the node's system
# and configuration, the kubelet's and container runtimes' state (pod volumes, secrets,
# images) and their sockets (/run, /var/run), kernel interfaces.
PROTECTED_HOST_PATHS = (
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/run", "/sbin", "/sys", "/usr", "/var/run", "/var/lib/kubelet", "/var/lib/containerd",
    "/var/lib/docker", "/var/lib/containers", "/var/lib/cri-o", "/var/lib/etcd", "/var/log",
)  # fmt: skip

_PATTERN = re.compile(r"^(\*|[a-z0-9][-a-z0-9.]*\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$")
_TOLERATION_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_CAPABILITY = re.compile(r"^[A-Z][A-Z0-9_]*$")


class PolicyError(ValueError):
    """The platform policy itself is wrong (a bad pattern, a protected host path...)."""


def matches(patterns: Iterable[str], name: str) -> bool:
    """Whether ``name`` is one of ``patterns`` (exact, prefix ending in ``*``, or ``*``)."""
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def path_problem(path: str) -> str | None:
    """Why an absolute host path is not in normal form, or None (no '.', '..' or empty parts)."""
    if not path.startswith("/"):
        return "is not an absolute path"
    parts = path.rstrip("/").split("/")[1:] if path != "/" else []
    if any(p in ("", ".", "..") for p in parts):
        return "is not in normal form (no '.', '..' or '//' parts)"
    return None


def normal_path(path: str) -> str:
    """``/a/b/`` -> ``/a/b`` (``/`` stays)."""
    return path.rstrip("/") or "/"


def under(path: str, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` or inside it, by whole path components."""
    path, prefix = normal_path(path), normal_path(prefix)
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def protected(path: str) -> str | None:
    """The protected host path that ``path`` is, lies under or contains, or None."""
    for guarded in PROTECTED_HOST_PATHS:
        if under(guarded, path) or (guarded != "/" and under(path, guarded)):
            return guarded
    return None


@dataclass(frozen=True)
class PlatformPolicy:
    """The platform's limits on what a MoEDeployment may put into engine pods (defaults: safe).

    Fields are the chart's ``platform.*`` values (camelCase there). ``capabilities`` is read by
    the admission policy only (no spec field sets a capability).
    """

    model_volume_sources: tuple[str, ...] = DEFAULT_VOLUME_SOURCES
    host_path_prefixes: tuple[str, ...] = ()
    host_network_namespaces: tuple[str, ...] = ()
    toleration_keys: tuple[str, ...] = ("nvidia.com/gpu",)
    env_secret_names: tuple[str, ...] = ()
    env_config_map_names: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ("IPC_LOCK",)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise PolicyError(f"platform.{_camel(f.name)} must be a list of strings, got {value!r}")
            object.__setattr__(self, f.name, tuple(dict.fromkeys(value)))
        prefixes = (normal_path(p) if path_problem(p) is None else p for p in self.host_path_prefixes)
        object.__setattr__(self, "host_path_prefixes", tuple(dict.fromkeys(prefixes)))
        problems = self.problems()
        if problems:
            raise PolicyError("; ".join(problems))

    # ---- reading -----------------------------------------------------------------------------

    def allows_host_network(self, namespace: str | None) -> bool:
        """Host networking is granted per namespace; without a namespace only by ``*``."""
        if namespace is None:
            return "*" in self.host_network_namespaces
        return matches(self.host_network_namespaces, namespace)

    def host_path_prefix_of(self, path: str) -> str | None:
        """The allowed prefix ``path`` lies under, or None."""
        return next((p for p in self.host_path_prefixes if under(path, p)), None)

    def problems(self) -> list[str]:
        """Everything wrong with this policy (the operator refuses to start on any)."""
        out: list[str] = []
        for source in self.model_volume_sources:
            if source in NEVER_MODEL_SOURCES:
                out.append(
                    f"platform.modelVolumeSources: {source} cannot be allowed ({NEVER_MODEL_SOURCES[source]})"
                )
            elif source not in VOLUME_SOURCES:
                out.append(
                    f"platform.modelVolumeSources: {source!r} is not a Kubernetes volume source; use "
                    f"some of {', '.join(sorted(VOLUME_SOURCES))}"
                )
        for prefix in self.host_path_prefixes:
            bad = path_problem(prefix)
            guarded = None if bad else protected(prefix)
            if bad:
                out.append(f"platform.hostPathPrefixes: {prefix!r} {bad}")
            elif guarded is not None:
                out.append(
                    f"platform.hostPathPrefixes: {prefix!r} reaches {guarded}, which no engine pod may "
                    "mount (node system, kubelet or container runtime state); use a directory that holds "
                    "only model weights, such as /raid/models"
                )
        for name, patterns in (
            ("hostNetworkNamespaces", self.host_network_namespaces),
            ("envSecretNames", self.env_secret_names),
            ("envConfigMapNames", self.env_config_map_names),
        ):
            for pattern in patterns:
                if not _PATTERN.match(pattern):
                    out.append(
                        f"platform.{name}: {pattern!r} is not a name pattern: use a lowercase name, a prefix "
                        "ending in * (such as hf-token*), or * alone"
                    )
        for key in self.toleration_keys:
            if not _TOLERATION_KEY.match(key) or len(key) > 316:
                out.append(f"platform.tolerationKeys: {key!r} is not a taint key (such as nvidia.com/gpu)")
        for cap in self.capabilities:
            if not _CAPABILITY.match(cap) or cap.startswith("CAP_"):
                out.append(f"platform.capabilities: {cap!r} is not a capability name (such as IPC_LOCK)")
            elif cap in ("SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE", "SYS_MODULE", "DAC_READ_SEARCH", "ALL"):
                out.append(f"platform.capabilities: {cap} gives the pod the node; it cannot be allowed")
        return out

    # ---- conversions -------------------------------------------------------------------------

    def to_values(self) -> dict[str, list[str]]:
        """The chart's ``platform:`` block (camelCase lists)."""
        return {_camel(f.name): list(getattr(self, f.name)) for f in fields(self)}

    def to_params(self) -> dict[str, str]:
        """The admission policy's parameter ConfigMap data: comma-separated lists."""
        return {key: ",".join(values) for key, values in self.to_values().items()}

    def to_args(self) -> list[str]:
        """`moe-operator run` flags that rebuild this policy (``capabilities`` has no flag)."""
        return [f"--{flag}={','.join(getattr(self, name))}" for flag, name in FLAGS.items()]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PlatformPolicy:
        """From the chart's ``platform:`` block (camelCase keys); keys it does not know are refused.

        Non-list keys of that block (such as ``admissionPolicy``, which only the chart reads) are
        skipped.
        """
        known = {_camel(f.name): f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in known:
                if isinstance(value, str) or not isinstance(value, list | tuple | type(None)):
                    raise PolicyError(f"platform.{key} must be a list, got {value!r}")
                kwargs[known[key]] = tuple(value or ())
            elif not isinstance(value, Mapping):
                raise PolicyError(f"platform.{key} is not a platform setting; known: {', '.join(known)}")
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: Path) -> PlatformPolicy:
        """From a YAML file: the ``platform:`` block alone or a chart values file holding one."""
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise PolicyError(f"{path}: cannot read the platform policy: {exc}") from exc
        if not isinstance(data, Mapping):
            raise PolicyError(f"{path}: a platform policy is a mapping (the chart's platform: block)")
        block = data.get("platform", data)
        if not isinstance(block, Mapping):
            raise PolicyError(f"{path}: platform: must be a mapping")
        return cls.from_mapping(block)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PlatformPolicy:
        """From `moe-operator run` flags: ``--platform-policy FILE``, then each list flag given."""
        base = cls.from_file(args.platform_policy) if getattr(args, "platform_policy", None) else cls()
        overrides = {}
        for flag, name in FLAGS.items():
            value = getattr(args, flag.replace("-", "_"), None)
            if value is not None:
                overrides[name] = tuple(v.strip() for v in value.split(",") if v.strip())
        return cls(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **overrides})


# `moe-operator run` flag -> field: each takes a comma-separated list ("" for none).
FLAGS = {
    "model-volume-sources": "model_volume_sources",
    "host-path-prefixes": "host_path_prefixes",
    "host-network-namespaces": "host_network_namespaces",
    "toleration-keys": "toleration_keys",
    "env-secret-names": "env_secret_names",
    "env-configmap-names": "env_config_map_names",
}
FLAG_HELP = {
    "model-volume-sources": "volume sources spec.model.volume may use (default: %s)",
    "host-path-prefixes": "host directories a hostPath model volume may lie under (default: none)",
    "host-network-namespaces": "namespaces (name, prefix*, or *) where spec.topology.hostNetwork is allowed "
    "(default: none)",
    "toleration-keys": "taint keys engine pods may tolerate (default: %s)",
    "env-secret-names": "Secrets (name or prefix*) spec.engine.env may read with secretKeyRef (default: none)",
    "env-configmap-names": "ConfigMaps (name or prefix*) spec.engine.env may read with configMapKeyRef "
    "(default: none)",
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The platform flags of `moe-operator run` (one definition for the CLI and the chart)."""
    defaults = PlatformPolicy()
    parser.add_argument(
        "--platform-policy",
        type=Path,
        default=None,
        help="YAML file with the platform limits (the chart's platform: block); flags below override it",
    )
    for flag, name in FLAGS.items():
        text = FLAG_HELP[flag]
        if "%s" in text:
            text = text % (",".join(getattr(defaults, name)) or "none")
        parser.add_argument(f"--{flag}", default=None, metavar="LIST", help=text.replace("%", "%%"))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


DEFAULT_POLICY = PlatformPolicy()
