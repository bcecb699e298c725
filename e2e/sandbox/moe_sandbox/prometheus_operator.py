"""The Prometheus Operator's PodMonitor and PrometheusRule CRDs, from its pinned upstream module.

Only the CRDs: no controller runs. They let the apiserver validate the objects the operator
renders for spec.monitoring against the real schemas (a field the schema does not know is
pruned or refused), exactly as on a cluster with the Prometheus Operator installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from moe_sandbox.cluster import Log, Sandbox, SandboxError, server_side_apply
from moe_sandbox.paths import cache_root

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"  # newest the Go module proxy serves here (v0.86+ are refused)
CRDS = {
    "podmonitors.monitoring.coreos.com": "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
    "prometheusrules.monitoring.coreos.com": "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
}
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIELD_MANAGER = "moe-sandbox"


def crd_files() -> dict[str, Path]:
    """CRD name -> its YAML, copied once from the module source into the cache (keyed by version)."""
    cached = cache_root() / "bin" / f"prometheus-operator-crds-{VERSION}"
    if not all((cached / f"{name}.yaml").exists() for name in CRDS):
        if shutil.which("go") is None:
            raise SandboxError("the Go toolchain is needed to fetch the Prometheus Operator's CRDs")
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                ["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"],
                cwd=tmp, capture_output=True, text=True,
            )  # fmt: skip
        if proc.returncode != 0:
            raise SandboxError(f"fetching {MODULE}@{VERSION} failed: {proc.stderr or proc.stdout}")
        source = Path(json.loads(proc.stdout)["Dir"])
        cached.mkdir(parents=True, exist_ok=True)
        for name, rel in CRDS.items():
            shutil.copyfile(source / rel, cached / f"{name}.yaml")
    return {name: cached / f"{name}.yaml" for name in CRDS}


def install(box: Sandbox, log: Log = print, timeout: float = 60) -> None:
    """Apply both CRDs and wait until they are served."""
    with box.client() as c:
        for name, path in crd_files().items():
            crd: dict[str, Any] = yaml.safe_load(path.read_text())
            server_side_apply(c, f"{CRD_PATH}/{name}", crd, FIELD_MANAGER)
        deadline = time.monotonic() + timeout
        while c.get("/apis/monitoring.coreos.com/v1/podmonitors").status_code != 200 or (
            c.get("/apis/monitoring.coreos.com/v1/prometheusrules").status_code != 200
        ):
            if time.monotonic() > deadline:
                raise SandboxError(f"the Prometheus Operator CRDs were not served within {timeout:.0f}s")
            time.sleep(0.5)
    log(f"Prometheus Operator CRDs {VERSION} installed (PodMonitor, PrometheusRule)")


def uninstall(box: Sandbox, timeout: float = 60) -> bool:
    """Delete both CRDs (and so every PodMonitor and PrometheusRule); returns whether one existed."""
    existed = False
    with box.client() as c:
        for name in CRDS:
            existed |= c.delete(f"{CRD_PATH}/{name}").status_code != 404
        deadline = time.monotonic() + timeout
        while any(c.get(f"{CRD_PATH}/{name}").status_code != 404 for name in CRDS):
            if time.monotonic() > deadline:
                raise SandboxError("the Prometheus Operator CRDs were not gone in time")
            time.sleep(0.5)
    return existed
