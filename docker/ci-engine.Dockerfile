# CI only: a stand-in for the SGLang image (lmsysorg/sglang cannot be pulled there), built by
# `bash docker/build.sh --local-base` on the debootstrapped Debian base. It holds what the
# engine image offers the runtime tree and the router, and nothing more: the system python3 with
# pip and the light packages of ci-engine-requirements.txt (no sglang, torch, kopf or kubernetes
# client).
# docker/runtime.Dockerfile is then built FROM it with --build-arg SGLANG_IMAGE.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY ci-engine-requirements.txt /tmp/ci-engine-requirements.txt
# The SGLang image installs into the system interpreter too; Debian marks that interpreter
# externally managed (PEP 668), hence --break-system-packages in this throwaway image.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && PIP_ROOT_USER_ACTION=ignore python3 -m pip install --no-cache-dir --disable-pip-version-check \
      --break-system-packages -r /tmp/ci-engine-requirements.txt \
 && rm /tmp/ci-engine-requirements.txt
