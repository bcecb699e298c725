#!/usr/bin/env bash
# Create .venv-runtime: the venv in which the runtime's tests run against the real
# SGLang 0.5.23 code (torch + sglang without their GPU-only dependencies).
#
#   bash runtime/scripts/setup-test-env.sh          # idempotent; fast when already set up
#   MOE_RUNTIME_VENV=/path bash runtime/scripts/setup-test-env.sh
#
# Why these steps:
# - torch from PyPI is the CUDA build: importing it needs the CUDA libraries it links
#   (cublas, cudnn, nccl, ...), even on a CPU-only machine. Installing torch with its
#   resolved dependencies is ~5.4 GB on disk; a hand-picked --no-deps set that still
#   imports is ~5.2 GB (it skips cusolver, nvtx, cuda-bindings) - not worth a list that
#   breaks on the next torch. pip's cache (~/.cache/pip) makes re-runs quick.
# - torch 2.14.1 is the version sglang 0.5.23 pins.
# - sglang is installed with --no-deps: its full dependency set (flashinfer, deep-gemm,
#   sgl-kernel, ...) is GPU-only. The light packages below are what the modules the
#   tests import need (plugins.hook_registry, eplb.*, server_args) on CPU.
# - sglang-router (the PD router, a Rust binary behind a Python argparse CLI) the same way: its
#   flag catalog and the rendered router commands are checked against its own parser. Its
#   declared dependencies are light; ROUTER_PACKAGES are those the light set lacks.
set -euo pipefail

TORCH_VERSION="2.14.1"
SGLANG_VERSION="0.5.23"
SGLANG_ROUTER_VERSION="0.3.2"
LIGHT_PACKAGES=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm IPython aiohttp)
ROUTER_PACKAGES=(setproctitle uvicorn fastapi)
# What SGLang's own server-argument resolution (ServerArgs.resolve_once + check_server_args) imports
# on CPU: the model config (transformers), and modules the arg hooks reach. tests/runtime/
# test_recipe_sglang.py runs it on every rendered command. torchvision without deps (it would pull
# another torch); 0.29.2 is the release built against torch 2.14.1.
RESOLVE_PACKAGES=(transformers==5.19.0 dill apache-tvm-ffi==0.1.11 sentencepiece compressed-tensors==0.18.0 gguf)
RESOLVE_NODEPS=(torchvision==0.29.2)
TEST_PACKAGES=(pytest pytest-timeout)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${MOE_RUNTIME_VENV:-$repo/.venv-runtime}"
python="${PYTHON:-python3}"
stamp="$venv/.moe-runtime-setup"

log() { printf '[setup-test-env %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
"$python" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { log "need Python >= 3.11 ($python)"; exit 1; }

# The distributions of the repository (the runtime's tests render the operator's examples; the
# tests' conftest loads the sandbox's pytest fixtures).
DISTS=(placement contract runtime operator e2e/sandbox)

project_deps() {
    "$python" - "$repo" "${DISTS[@]}" <<'EOF'
import re, sys, tomllib
repo, names = sys.argv[1], sys.argv[2:]
local = {"moe-placement", "moe-contract", "moe-runtime", "moe-operator", "moe-sandbox"}
deps = []
for name in names:
    with open(f"{repo}/{name}/pyproject.toml", "rb") as fh:
        deps += tomllib.load(fh)["project"]["dependencies"]
print("\n".join(d for d in dict.fromkeys(deps) if re.split(r"[=<>!~ \[]", d)[0] not in local))
EOF
}

# What the venv depends on: pinned versions, package lists, and the parts of each pyproject.toml
# that change an install (dependencies, entry points, scripts, package discovery).
project_install_surface() {
    "$python" - "$repo" "${DISTS[@]}" <<'EOF'
import json, sys, tomllib
repo, names = sys.argv[1], sys.argv[2:]
surface = {}
for name in names:
    with open(f"{repo}/{name}/pyproject.toml", "rb") as fh:
        doc = tomllib.load(fh)
    project = doc["project"]
    part = {k: project.get(k) for k in ("dependencies", "entry-points", "scripts")}
    part["setuptools"] = doc.get("tool", {}).get("setuptools", {})
    surface[name] = part
print(json.dumps(surface, sort_keys=True))
EOF
}
key="$( {
    echo "$TORCH_VERSION $SGLANG_VERSION ${LIGHT_PACKAGES[*]} ${TEST_PACKAGES[*]}"
    echo "sglang-router $SGLANG_ROUTER_VERSION ${ROUTER_PACKAGES[*]}"
    echo "resolve ${RESOLVE_PACKAGES[*]} ${RESOLVE_NODEPS[*]}"
    project_install_surface
    "$python" --version
} | sha256sum | cut -c1-16)"

check_imports() {
    "$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import torch  # noqa: F401
import sglang.srt.eplb.eplb_algorithms  # noqa: F401
import sglang.srt.eplb.expert_location  # noqa: F401
import sglang.srt.plugins.hook_registry  # noqa: F401
import transformers  # noqa: F401
import torchvision  # noqa: F401
import moe_runtime.sglang_plugin  # noqa: F401
import sglang_router.launch_router  # noqa: F401
eps = [ep.value for ep in md.entry_points(group="sglang.srt.plugins")]
assert "moe_runtime.sglang_plugin:register" in eps, eps
print(
    f"torch {torch.__version__}, sglang {md.version('sglang')}, "
    f"sglang-router {md.version('sglang-router')}, plugin entry point registered"
)
EOF
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]] && summary="$(check_imports 2>&1)"; then
    log "already set up: $venv (key $key): $summary"
    exit 0
fi

start=$SECONDS
if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
rm -f "$stamp"

log "installing torch==$TORCH_VERSION (CUDA build from PyPI; ~3 GB download, ~5.4 GB installed)"
"${pip[@]}" install "torch==$TORCH_VERSION"
log "torch done ($((SECONDS - start)) s)"

log "installing sglang==$SGLANG_VERSION without dependencies, plus the light packages it needs on CPU"
"${pip[@]}" install --no-deps "sglang==$SGLANG_VERSION"
"${pip[@]}" install "${LIGHT_PACKAGES[@]}"
log "installing what SGLang's argument resolution imports on CPU"
"${pip[@]}" install "${RESOLVE_PACKAGES[@]}"
"${pip[@]}" install --no-deps "${RESOLVE_NODEPS[@]}"

log "installing sglang-router==$SGLANG_ROUTER_VERSION without dependencies, plus what it imports"
"${pip[@]}" install --no-deps "sglang-router==$SGLANG_ROUTER_VERSION"
"${pip[@]}" install "${ROUTER_PACKAGES[@]}"

log "installing the project (editable, no deps) and its declared dependencies"
mapfile -t deps < <(project_deps)
"${pip[@]}" install "${deps[@]}" "${TEST_PACKAGES[@]}"
editables=()
for dist in "${DISTS[@]}"; do editables+=(-e "$repo/$dist"); done
"${pip[@]}" install --no-deps "${editables[@]}"

log "checking imports"
check_imports
echo "$key" > "$stamp"
log "ready in $((SECONDS - start)) s: $venv ($(du -sh "$venv" | cut -f1))"
