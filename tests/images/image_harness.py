"""The built images, run with buildah (no Docker engine): built by docker/build.sh (cached by
content), loaded from the OCI archives it writes into a private throwaway store, and run with
chroot isolation on the host network (the sandbox listens on loopback only)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The tree the init container copies and the engine container puts on PYTHONPATH.
RUNTIME_TREE = "/opt/moe-runtime"


@dataclass(frozen=True)
class BuiltImages:
    """What `docker/build.sh` reported in build.env: archives, image names, sizes, revision."""

    dir: Path
    env: Mapping[str, str]

    def archive(self, name: str) -> Path:
        return Path(self.env[f"MOE_{name.upper()}_ARCHIVE"])

    def image(self, name: str) -> str:
        return self.env[f"MOE_{name.upper()}_IMAGE"]

    def packages(self, name: str) -> str:
        return (self.dir / f"moe-{name}.packages.txt").read_text()


def build_images(out: Path) -> BuiltImages:
    """Both images on the CI base (`docker/build.sh --local-base`): a cache hit takes seconds."""
    proc = subprocess.run(
        ["bash", str(REPO / "docker" / "build.sh"), "--local-base", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"docker/build.sh failed:\n{proc.stderr[-4000:]}"
    print(proc.stderr, end="")  # the build's summary (sizes, times) in the test log
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"MOE_IMAGES={out}", proc.stdout
    env = {}
    for line in (out / "build.env").read_text().splitlines():
        key, _, value = line.partition("=")
        env[key] = value.strip("'")
    return BuiltImages(out, env)


def oci_manifest(archive: Path) -> dict[str, Any]:
    """The image manifest inside an OCI archive (its annotations are the OCI annotations)."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            algo, _, hexd = digest.partition(":")
            member = tar.extractfile(f"blobs/{algo}/{hexd}")
            assert member is not None
            data = member.read()
            assert hashlib.sha256(data).hexdigest() == hexd
            loaded: dict[str, Any] = json.loads(data)
            return loaded

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.loads(index_file.read())
        assert len(index["manifests"]) == 1, index
        return blob(index["manifests"][0]["digest"])


class Store:
    """A private buildah store in a temporary directory, with the storage driver docker/build.sh
    found working here (overlay, else vfs)."""

    def __init__(self, driver: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="moe-image-tests.", dir=os.environ.get("TMPDIR", "/var/tmp")))
        self.base = [
            "buildah", "--root", str(self.dir / "storage"), "--runroot", str(self.dir / "run"),
            "--storage-driver", driver,
        ]  # fmt: skip

    def buildah(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.base, *args], capture_output=True, text=True)
        if check:
            assert proc.returncode == 0, f"buildah {' '.join(args)}: {proc.stderr[-2000:]}"
        return proc

    def load(self, archive: Path) -> str:
        """Pull an OCI archive into the store; returns the image id."""
        return self.buildah("pull", "-q", f"oci-archive:{archive}").stdout.strip().splitlines()[-1]

    def image_config(self, image: str) -> dict[str, Any]:
        """The OCI image config (Entrypoint, User, Env, Labels, ...)."""
        info = json.loads(self.buildah("inspect", "--type", "image", image).stdout)
        config: dict[str, Any] = info["OCIv1"]["config"]
        return config

    def container(self, image: str) -> str:
        """A working container of the image (a fresh copy of its file system)."""
        return self.buildah("from", "-q", "--pull=never", image).stdout.strip()

    def mount(self, container: str) -> Path:
        return Path(self.buildah("mount", container).stdout.strip())

    def run_argv(
        self,
        container: str,
        argv: Sequence[str],
        *,
        volumes: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> list[str]:
        """`buildah run` of argv in the container: chroot isolation, the host's network."""
        args = [*self.base, "run", "--isolation", "chroot", "--network", "host"]
        for volume in volumes:
            args += ["-v", volume]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        if user is not None:
            args += ["--user", user]
        return [*args, container, "--", *argv]

    def run(self, container: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.run_argv(container, argv, **kw), capture_output=True, text=True, timeout=300
        )

    def start(self, container: str, argv: Sequence[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        """`buildah run` of argv in the background, its output to log; stop it with stop()."""
        with open(log, "wb") as out:
            return subprocess.Popen(
                self.run_argv(container, argv, **kw),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # buildah and the command in one group, stopped together
            )

    def remove(self) -> None:
        self.buildah("rm", "--all", check=False)
        mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
        for target in sorted((m for m in mounts.split() if m.startswith(f"{self.dir}/")), reverse=True):
            subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the command that Store.start ran (as the kubelet signals a container), not to
    buildah and its chroot helpers, which would kill it outright; buildah then exits with the
    command's status."""
    if proc.poll() is None:
        for pid in session_leaves(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode


def session_leaves(sid: int) -> list[int]:
    """Processes of a session that have no children in it (buildah -> buildah-chroot-runtime ->
    buildah-chroot-exec -> the command): from /proc, the fields after the command name in stat."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                parents[int(stat.parent.name)] = int(fields[1])
    return [pid for pid in parents if pid not in parents.values()]


# The engine container's view of the copied tree: what imports, from where, and what does not.
PROBE = r"""
import importlib, importlib.metadata as md, importlib.util, json, pkgutil, sys
tree = sys.argv[1]
out = {"failed": {}, "outside": [], "modules": 0}
for top in ("moe_runtime", "moe_placement", "moe_contract"):
    pkg = importlib.import_module(top)
    for info in pkgutil.walk_packages(pkg.__path__, top + "."):
        try:
            mod = importlib.import_module(info.name)
        except Exception as exc:
            out["failed"][info.name] = f"{type(exc).__name__}: {exc}"
            continue
        out["modules"] += 1
        if not (getattr(mod, "__file__", None) or tree).startswith(tree + "/"):
            out["outside"].append(info.name)
out["importable"] = {m: importlib.util.find_spec(m) is not None
                     for m in ("kopf", "kubernetes", "moe_operator", "moe_sandbox", "httpx", "sglang")}
out["plugins"] = {e.name: [e.value, str(e.dist.locate_file(""))] for e in md.entry_points(group="sglang.srt.plugins")}
out["dists"] = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions(path=[tree]))
print(json.dumps(out))
"""
