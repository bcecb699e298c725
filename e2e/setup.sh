#!/usr/bin/env bash
# Installs everything the project needs on a Debian/Ubuntu machine with Python 3.11+ and Go 1.26+:
# Debian packages, the Python virtualenv (.venv), and the sandbox's upstream Kubernetes binaries
# built from the Go module proxy (cached in ~/.cache/moe-operator, keyed by version).
# Idempotent: a second run only checks. Prints what it does.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

# Debian packages: openssl (sandbox PKI), lua5.1 (Argo CD health check tests),
# prometheus (promtool for alert rule tests, and a real Prometheus for the demo).
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v lua5.1 >/dev/null || need+=(lua5.1)
# The demo (e2e/demo.sh) runs the prometheus server binary itself, so check for both.
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)
# buildah, skopeo, debootstrap: docker/build.sh builds the images without a Docker engine, on a
# Debian base made locally (tests/images smoke-test the built images).
command -v buildah >/dev/null || need+=(buildah)
command -v skopeo >/dev/null || need+=(skopeo)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  step "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

command -v go >/dev/null || { echo "error: Go >= 1.26 is required to build the sandbox (https://go.dev/dl)" >&2; exit 1; }
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'

# The four distributions (placement, contract, runtime, operator) and the dev-only sandbox, editable,
# plus the dev tools
# (pyproject.toml's dependency group; pip >= 25.1 reads it).
stamp=.venv/.installed-$(cat pyproject.toml {placement,contract,runtime,operator,e2e/sandbox}/pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  step "creating the Python virtualenv .venv (operator, runtime, shared packages, dev tools)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip uninstall -q -y moe-operator 2>/dev/null || true  # an older single-distribution install
  .venv/bin/pip install -q -e placement -e contract -e runtime -e operator -e e2e/sandbox --group dev
  rm -f .venv/.installed-*; touch "$stamp"
fi

# The placement planner's compiled loops (numba, placement/moe_placement/compiled.py): compiled
# once here (~15 s) into numba's on-disk cache, so the sandbox's runtimes and the tests load them.
step "compiling the placement planner's loops (numba; cached)"
.venv/bin/python -c 'from moe_placement.compiled import warm; warm()'

step "building the sandbox's pinned upstream binaries (first time: 15-30 min on 2 cores; then cached)"
.venv/bin/moe-sandbox build
