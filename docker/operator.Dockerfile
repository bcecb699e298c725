# The operator image: `moe-operator run` (reconciler + validating webhook).
# Build from the repository root:
#   set -a; . docker/versions.env; set +a
#   docker build -f docker/operator.Dockerfile \
#     --build-arg PYTHON_IMAGE --build-arg MOE_OPERATOR_VERSION \
#     -t ghcr.io/moe-inference/moe-operator:$MOE_OPERATOR_VERSION .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY runtime ./runtime
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG MOE_OPERATOR_VERSION=0.1.0
LABEL org.opencontainers.image.title="moe-operator" \
      org.opencontainers.image.version="${MOE_OPERATOR_VERSION}" \
      org.opencontainers.image.source="https://github.com/moe-operator/moe-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/moe-operator \
    XDG_CACHE_HOME=/home/moe-operator/.cache
# openssl: the operator generates its webhook CA and serving certificate with it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
RUN groupadd --gid 10001 moe \
 && useradd --uid 10001 --gid 10001 --home-dir /home/moe-operator --create-home --shell /usr/sbin/nologin moe \
 && mkdir -p /home/moe-operator/.cache && chown -R 10001:10001 /home/moe-operator
USER 10001:10001
# 8080 liveness (/healthz), 9100 metrics, 9443 webhook.
EXPOSE 8080 9100 9443
ENTRYPOINT ["moe-operator", "run"]
