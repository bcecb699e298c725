# The runtime image: SGLang, the pinned sglang-router, and the engine pod's runtime tree in
# /opt/moe-runtime.
# Engine pods use the tree, not this image's SGLang: an init container of this image copies
# /opt/moe-runtime into a shared emptyDir (`cp -r /opt/moe-runtime/. <emptyDir>/`), and the engine
# container (spec.engine.image, an SGLang image) runs `python3 -m moe_runtime.cli launch` with
# PYTHONPATH=/opt/moe-runtime. The tree therefore holds exactly moe_runtime, moe_placement and
# moe_contract with their dist-info (SGLang finds the plugin through the `sglang.srt.plugins`
# entry point in moe_runtime's dist-info), and no dependencies: numpy, pydantic, aiohttp and
# prometheus-client come with SGLang.
# The operator renders and checks the router's flags for one sglang-router version
# (SGLANG_ROUTER_VERSION; the router Deployment's init container refuses any other), and an
# SGLang image may ship another: this image pins it, so it can serve as spec.router.image.
#
# Build from the repository root (`bash docker/build.sh` does this with buildah; see
# docs/install.md#images). With Docker:
#   set -a; . docker/versions.env; set +a
#   docker build -f docker/runtime.Dockerfile \
#     --build-arg SGLANG_IMAGE --build-arg SGLANG_ROUTER_VERSION --build-arg MOE_OPERATOR_VERSION \
#     --build-arg MOE_REVISION=$(git rev-parse HEAD) \
#     -t ghcr.io/moe-inference/moe-runtime:$MOE_OPERATOR_VERSION .
# The build context is limited by docker/runtime.Dockerfile.dockerignore.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
FROM ${SGLANG_IMAGE}
ARG SGLANG_ROUTER_VERSION=0.3.2
ARG MOE_OPERATOR_VERSION=0.1.0
ARG MOE_REVISION=unknown
ARG MOE_SOURCE=https://github.com/moe-operator/moe-operator
LABEL org.opencontainers.image.title="moe-runtime" \
      org.opencontainers.image.description="SGLang with the pinned sglang-router, plus the MoE engine pod runtime tree (/opt/moe-runtime) that engine pods copy" \
      org.opencontainers.image.version="${MOE_OPERATOR_VERSION}" \
      org.opencontainers.image.revision="${MOE_REVISION}" \
      org.opencontainers.image.source="${MOE_SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Into the engine's own interpreter, like SGLang's image installs it (PIP_BREAK_SYSTEM_PACKAGES:
# a Debian/Ubuntu python3 is marked externally managed; pips that predate the marker ignore it).
# --no-deps: the router's dependencies (fastapi, uvicorn, orjson, setproctitle, aiohttp) come
# with SGLang; the build fails unless that version is the one installed and its launcher loads
# the Rust router.
RUN PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1 \
    python3 -m pip install --no-cache-dir --no-deps "sglang-router==${SGLANG_ROUTER_VERSION}" \
 && python3 -c "import importlib.metadata as m, sys, sglang_router.launch_router as r; \
have = m.version('sglang-router'); \
assert have == sys.argv[1], f'sglang-router {have}, not {sys.argv[1]}'; \
assert r.Router is not None, 'the Rust router does not load'" "${SGLANG_ROUTER_VERSION}"
WORKDIR /tmp/moe-src
COPY placement/pyproject.toml placement/
COPY placement/moe_placement placement/moe_placement
COPY contract/pyproject.toml contract/
COPY contract/moe_contract contract/moe_contract
COPY runtime/pyproject.toml runtime/
COPY runtime/moe_runtime runtime/moe_runtime
# --no-deps: everything else comes from the engine image. bin/ (the moe-runtime console script,
# with this build's interpreter path) is dropped: engine pods run `python3 -m moe_runtime.cli`.
# The build fails unless the tree alone (PYTHONPATH, like the engine pod) yields the
# `sglang.srt.plugins` entry point and nothing of the operator.
RUN PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install --no-cache-dir --no-deps --target /opt/moe-runtime ./placement ./contract ./runtime \
 && rm -rf /opt/moe-runtime/bin /tmp/moe-src \
 && PYTHONPATH=/opt/moe-runtime python3 -c "import importlib.metadata as m, moe_runtime.cli; \
eps = [e.name for e in m.entry_points(group='sglang.srt.plugins')]; \
assert 'moe_operator_eplb' in eps, eps" \
 && test ! -e /opt/moe-runtime/moe_operator \
 && chmod -R a+rX /opt/moe-runtime
WORKDIR /
ENV PYTHONPATH=/opt/moe-runtime
# The init container only copies files: it needs no root. (Engine pods do not run this image's
# user: the engine container runs spec.engine.image.)
USER 10001:10001
