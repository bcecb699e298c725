"""Build the sandbox's upstream binaries from the Go module proxy, cached by pinned version.

No release binaries can be downloaded on the machines this project is developed and
tested on, but the Go module proxy is reachable, so kube-apiserver & co. are compiled
from the exact upstream module versions pinned in ``e2e/toolchain/*/go.mod``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from moe_sandbox.paths import cache_root, toolchain_dir


@dataclass(frozen=True)
class Component:
    """One wrapper module under e2e/toolchain and the binaries it produces."""

    name: str
    module: str
    version: str
    packages: dict[str, str]  # binary name -> Go package path
    ldflags: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Cache key: version plus a hash of the wrapper's go.mod/go.sum (pins of every dep)."""
        digest = hashlib.sha256()
        for fname in ("go.mod", "go.sum"):
            digest.update((toolchain_dir() / self.name / fname).read_bytes())
        return f"{self.name}-{self.version}-{digest.hexdigest()[:12]}"


def _k8s_version_ldflags(version: str) -> list[str]:
    major, minor, _ = version.lstrip("v").split(".")
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return flags


KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
LWS_VERSION = "v0.7.0"
KUBE_SCORE_VERSION = "v1.20.0"

COMPONENTS: tuple[Component, ...] = (
    Component(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        packages={"etcd": "go.etcd.io/etcd/server/v3"},
    ),
    Component(
        name="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK_VERSION,
        packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        ldflags=[f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION}"],
    ),
    Component(
        name="helm",
        module="helm.sh/helm/v3",
        version=HELM_VERSION,
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        ldflags=[f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"],
    ),
    Component(
        name="lws",
        module="sigs.k8s.io/lws",
        version=LWS_VERSION,
        packages={"lws-controller": "sigs.k8s.io/lws/cmd"},
        ldflags=[f"-X sigs.k8s.io/lws/pkg/version.GitVersion={LWS_VERSION}"],
    ),
    # A manifest linter nobody here wrote (tests/security/test_linters.py), not part of the sandbox.
    Component(
        name="kube-score",
        module="github.com/zegl/kube-score",
        version=KUBE_SCORE_VERSION,
        packages={"kube-score": "github.com/zegl/kube-score/cmd/kube-score"},
        ldflags=[f"-X main.version={KUBE_SCORE_VERSION}"],
    ),
    Component(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        packages={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
        ldflags=_k8s_version_ldflags(KUBERNETES_VERSION),
    ),
)

BINARIES = tuple(b for c in COMPONENTS for b in c.packages)


class BuildError(RuntimeError):
    """A Go build failed; the message names the module and version."""


def bin_dir(component: Component) -> Path:
    return cache_root() / "bin" / component.key


def binary_path(name: str) -> Path:
    """Where a built binary lives (it may not exist yet)."""
    for comp in COMPONENTS:
        if name in comp.packages:
            return bin_dir(comp) / name
    raise KeyError(f"unknown sandbox binary {name!r}; known: {', '.join(BINARIES)}")


def missing() -> list[Component]:
    return [c for c in COMPONENTS if not all((bin_dir(c) / b).exists() for b in c.packages)]


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def build_component(comp: Component, log: Callable[[str], None]) -> None:
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain is not on PATH; install Go >= 1.26 to build the sandbox")
    out = bin_dir(comp)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    src = toolchain_dir() / comp.name
    ldflags = " ".join(["-s", "-w", *comp.ldflags])
    for binary, pkg in comp.packages.items():
        started = time.monotonic()
        log(f"  building {binary} from {comp.module}@{comp.version} ...")
        proc = subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp / binary), pkg],
            cwd=src,
            env=_go_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
            raise BuildError(f"building {binary} from {comp.module}@{comp.version} failed:\n{tail}")
        log(f"  built {binary} in {time.monotonic() - started:.0f}s")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    if comp.name == "kwok":
        kwok_stage_files()
    if comp.name == "lws":
        lws_crd_file()


def ensure_built(log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> None:
    """Build every component whose binaries are not cached for the pinned version."""
    todo = missing()
    if not todo:
        return
    log(f"building sandbox binaries from the Go module proxy (cached in {cache_root() / 'bin'}):")
    for i, comp in enumerate(todo, 1):
        log(f"[{i}/{len(todo)}] {comp.module}@{comp.version}")
        build_component(comp, log)


KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/general/pod-create.yaml",
    "pod/general/pod-init-container-running.yaml",
    "pod/general/pod-init-container-completed.yaml",
    "pod/general/pod-ready.yaml",
    "pod/general/pod-complete.yaml",
    "pod/general/pod-delete.yaml",
)


def _module_dir(comp: Component) -> Path:
    """The unpacked source of a component's pinned module (from the Go module cache)."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{comp.module}@{comp.version}"],
        cwd=toolchain_dir() / comp.name,
        env=_go_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"fetching {comp.module}@{comp.version} failed: {proc.stderr}")
    return Path(json.loads(proc.stdout)["Dir"])


LWS_CRD = "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def lws_crd_file() -> Path:
    """The LeaderWorkerSet CRD of the pinned controller version, taken from its module source."""
    lws = next(c for c in COMPONENTS if c.name == "lws")
    cached = bin_dir(lws) / "crd.yaml"
    if not cached.exists():
        shutil.copyfile(_module_dir(lws) / LWS_CRD, cached)
    return cached


def kwok_stage_files() -> list[Path]:
    """kwok v0.8 refuses to start without stages; take the upstream ones of the pinned version."""
    kwok = next(c for c in COMPONENTS if c.name == "kwok")
    cached = bin_dir(kwok) / "stages"
    if not all((cached / s).exists() for s in KWOK_STAGES):
        src = _module_dir(kwok) / "kustomize" / "stage"
        for stage in KWOK_STAGES:
            (cached / stage).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / stage, cached / stage)
    return [cached / s for s in KWOK_STAGES]
