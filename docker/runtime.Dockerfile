# The runtime image: SGLang plus the moe_runtime package (launcher, EPLB sidecar, SGLang plugin).
# Engine pods use it twice: an init container copies /opt/moe-runtime into a shared emptyDir,
# and the engine runs `python3 -m moe_runtime.cli launch` with PYTHONPATH=/opt/moe-runtime.
# Build from the repository root:
#   set -a; . docker/versions.env; set +a
#   docker build -f docker/runtime.Dockerfile \
#     --build-arg SGLANG_IMAGE --build-arg MOE_OPERATOR_VERSION \
#     -t ghcr.io/moe-inference/moe-runtime:$MOE_OPERATOR_VERSION .
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
FROM ${SGLANG_IMAGE}
ARG MOE_OPERATOR_VERSION=0.1.0
LABEL org.opencontainers.image.title="moe-runtime" \
      org.opencontainers.image.version="${MOE_OPERATOR_VERSION}" \
      org.opencontainers.image.source="https://github.com/moe-operator/moe-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /tmp/moe-src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY runtime ./runtime
# 1. The copyable package tree (no dependencies: sglang, torch and DeepEP come from the base
#    image), which the operator's init container copies into every engine pod.
# 2. The same package installed into the image's python so SGLang finds the
#    `sglang.srt.plugins` entry point (moe_operator_eplb) in every process.
RUN pip install --no-cache-dir --no-deps --target /opt/moe-runtime . \
 && pip install --no-cache-dir --no-deps . \
 && python3 -c "import importlib.metadata as m; \
eps = [e.name for e in m.entry_points(group='sglang.srt.plugins')]; \
assert 'moe_operator_eplb' in eps, eps" \
 && test -d /opt/moe-runtime/moe_runtime \
 && rm -rf /tmp/moe-src
WORKDIR /
ENV PYTHONPATH=/opt/moe-runtime
