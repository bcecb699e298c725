"""The pinned package list of a built image, read from its mounted file system (docker/build.sh).

    python3 docker/packages.py ROOT LABEL TREE_GLOB [--largest N]

Prints, in pip freeze form (name==version): the distributions in TREE_GLOB (the operator's
virtualenv, or the runtime tree), then the base image's system Python packages, then the
Debian packages (dpkg's database in ROOT). --largest N also prints the N largest entries of
the tree to stderr: what the image size is made of.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata as md
import os
import subprocess
import sys


def freeze(paths: list[str]) -> list[str]:
    found = {
        d.metadata["Name"].lower(): f"{d.metadata['Name']}=={d.version}" for d in md.distributions(path=paths)
    }
    return [found[name] for name in sorted(found)]


def size_mb(path: str) -> float:
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e6
    total = 0
    for folder, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("label")
    parser.add_argument("tree")
    parser.add_argument("--largest", type=int, default=0)
    args = parser.parse_args()
    root = args.root.rstrip("/")

    def shown(paths: list[str]) -> str:
        return " ".join(p[len(root) :] for p in paths) or "none"

    tree = sorted(glob.glob(root + args.tree))
    system = [
        p
        for p in sorted(
            glob.glob(root + "/usr/lib/python3*/*-packages")
            + glob.glob(root + "/usr/local/lib/python3*/*-packages")
        )
        if p not in tree
    ]
    lines = [f"# {args.label}: {shown(tree)}", *freeze(tree)]
    lines += [f"# base image Python packages: {shown(system)}", *freeze(system)]
    if os.path.isdir(f"{root}/var/lib/dpkg"):
        dpkg = subprocess.run(
            ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package}=${Version}\n"],
            capture_output=True,
            text=True,
            check=True,
        )
        lines += ["# Debian packages", *dpkg.stdout.splitlines()]
    print("\n".join(lines))
    if args.largest:
        entries = [os.path.join(t, name) for t in tree for name in os.listdir(t)]
        largest = sorted(((size_mb(p), os.path.basename(p)) for p in entries), reverse=True)[: args.largest]
        print(", ".join(f"{name} {mb:.0f} MB" for mb, name in largest), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
