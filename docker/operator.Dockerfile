# The operator image: `moe-operator run` (reconciler + validating webhook).
# It holds the moe-operator, moe-placement and moe-contract distributions and their dependencies
# in a virtualenv (/opt/moe-operator), and nothing of the engine runtime.
#
# Build from the repository root (`bash docker/build.sh` does this with buildah; see
# docs/install.md#images). With Docker:
#   set -a; . docker/versions.env; set +a
#   docker build -f docker/operator.Dockerfile \
#     --build-arg PYTHON_IMAGE --build-arg MOE_OPERATOR_VERSION \
#     --build-arg MOE_REVISION=$(git rev-parse HEAD) \
#     -t ghcr.io/moe-inference/moe-operator:$MOE_OPERATOR_VERSION .
# The build context is limited by docker/operator.Dockerfile.dockerignore.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY placement/pyproject.toml placement/
COPY placement/moe_placement placement/moe_placement
COPY contract/pyproject.toml contract/
COPY contract/moe_contract contract/moe_contract
COPY operator/pyproject.toml operator/
COPY operator/moe_operator operator/moe_operator
# The three distributions with their dependencies from PyPI; then the installer itself goes
# (pip, setuptools): the image runs the operator, it installs nothing. Also dropped, as nothing
# imports them: the kubernetes client's asyncio copy (kubernetes/aio, 68 MB with its bytecode;
# the operator uses the synchronous client, kopf its own aiohttp) and numpy's test suites (18 MB).
RUN python3 -m venv /opt/moe-operator \
 && /opt/moe-operator/bin/pip install --no-cache-dir --disable-pip-version-check \
      ./placement ./contract ./operator \
 && /opt/moe-operator/bin/pip uninstall --yes --quiet pip setuptools \
 && site=$(echo /opt/moe-operator/lib/python3*/site-packages) \
 && rm -rf "$site/kubernetes/aio" \
 && find "$site/numpy" -depth -type d -name tests -exec rm -rf {} + \
 && /opt/moe-operator/bin/moe-operator --help >/dev/null \
 && /opt/moe-operator/bin/python -c "import kubernetes.client, kubernetes.config, numpy, moe_operator.cli.run; \
import moe_placement.compiled as c; assert c.AVAILABLE, 'numba (moe-placement[fast]) is missing'"

FROM ${PYTHON_IMAGE}
ARG MOE_OPERATOR_VERSION=0.1.0
ARG MOE_REVISION=unknown
ARG MOE_SOURCE=https://github.com/moe-operator/moe-operator
LABEL org.opencontainers.image.title="moe-operator" \
      org.opencontainers.image.description="Kubernetes operator for MoE inference with SGLang: reconciler and validating webhook" \
      org.opencontainers.image.version="${MOE_OPERATOR_VERSION}" \
      org.opencontainers.image.revision="${MOE_REVISION}" \
      org.opencontainers.image.source="${MOE_SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/moe-operator/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/moe-operator \
    XDG_CACHE_HOME=/home/moe-operator/.cache
# The user the chart runs as (podSecurityContext 10001:10001); written straight into the
# account files so the final stage needs no package manager or shadow tools.
RUN echo "moe:x:10001:10001:moe-operator:/home/moe-operator:/usr/sbin/nologin" >> /etc/passwd \
 && echo "moe:x:10001:" >> /etc/group \
 && mkdir -p /home/moe-operator/.cache \
 && chown -R 10001:10001 /home/moe-operator
COPY --from=build /opt/moe-operator /opt/moe-operator
USER 10001:10001
WORKDIR /home/moe-operator
# 8080 liveness (/healthz), 9100 metrics, 9443 webhook.
EXPOSE 8080 9100 9443
ENTRYPOINT ["moe-operator", "run"]
