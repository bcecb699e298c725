"""Process-wide state of a running operator: its API client and settings (set once at start)."""

from __future__ import annotations

from moe_operator.handlers.kube import Kube
from moe_operator.render.group import RuntimeSettings

_kube: Kube | None = None
_settings = RuntimeSettings()


def configure(kube: Kube, settings: RuntimeSettings) -> None:
    global _kube, _settings
    _kube, _settings = kube, settings


def kube() -> Kube:
    if _kube is None:
        raise RuntimeError("the operator's Kubernetes client is not configured (moe-operator run sets it)")
    return _kube


def settings() -> RuntimeSettings:
    return _settings
