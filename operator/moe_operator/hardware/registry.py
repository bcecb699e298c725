"""The profiles the operator knows: the shipped file plus the platform's own (by name, theirs win)."""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

import yaml

from .profile import HardwareProfile

PROFILES_ENV = "MOE_HARDWARE_PROFILES"
"""Path of a platform's profile file (the chart mounts its ConfigMap there); same format as the shipped one."""


def _parse(text: str, origin: str) -> dict[str, HardwareProfile]:
    doc = yaml.safe_load(text) or {}
    items = doc.get("profiles") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"{origin}: expected a mapping with a list under 'profiles'")
    out: dict[str, HardwareProfile] = {}
    for item in items:
        profile = HardwareProfile.model_validate(item)
        out[profile.name] = profile
    return out


def load_profiles(extra: str | None = None) -> dict[str, HardwareProfile]:
    """Shipped profiles, then those of ``extra`` (a file path) replacing any of the same name."""
    shipped = resources.files(__package__).joinpath("data/hardware.yaml").read_text()
    out = _parse(shipped, "shipped hardware.yaml")
    if extra:
        out.update(_parse(Path(extra).read_text(), extra))
    return out


class ProfilesError(ValueError):
    """The platform's profile file cannot be used: a platform configuration error, not a tenant's."""


@functools.cache
def _profiles() -> dict[str, HardwareProfile]:
    path = os.environ.get(PROFILES_ENV) or None
    try:
        return load_profiles(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ProfilesError(
            f"the platform's hardware profiles ({PROFILES_ENV}={path}) cannot be loaded: {exc}"
        ) from exc


def profile_names() -> list[str]:
    return sorted(_profiles())


def known_profile(name: str) -> bool:
    return name in _profiles()


def lookup_profile(name: str) -> HardwareProfile:
    """The profile called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return _profiles()[name]
    except KeyError:
        raise ValueError(
            f"unknown hardware profile {name!r}: known are {', '.join(profile_names())} "
            f"(a platform adds its own with {PROFILES_ENV})"
        ) from None
