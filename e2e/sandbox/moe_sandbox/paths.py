"""Where the sandbox keeps its cache and its runtime state."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The project checkout this package runs from (the sandbox needs e2e/toolchain)."""
    env = os.environ.get("MOE_REPO_ROOT")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3]


def toolchain_dir() -> Path:
    return repo_root() / "e2e" / "toolchain"


def cache_root() -> Path:
    """Built binaries, keyed by version; survives `sandbox down` and reuse of the machine."""
    base = os.environ.get("MOE_SANDBOX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "moe-operator"
    )
    return Path(base)


def state_dir() -> Path:
    """PKI, kubeconfig, etcd data, logs and pid files of the running sandbox."""
    return Path(os.environ.get("MOE_SANDBOX_DIR") or cache_root() / "sandbox")
