# One image for every hivemux service: `hivemux service <name>` picks which one runs.
#   docker build -t hivemux:0.1.0 .

# The xCUDA shim (native/xcuda), built with the compiler of this stage and shipped in the
# image below: the executor preloads it into offline workloads (hivemux.xcuda).
FROM python:3.11-slim AS xcuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY native/xcuda ./native/xcuda
COPY libs/hivemux/xcuda/xcuda_layout.h ./libs/hivemux/xcuda/xcuda_layout.h
RUN make -C native/xcuda clean && make -C native/xcuda build/libxcuda.so

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HIVEMUX_SCHEMAS_DIR=/opt/hivemux/schemas

WORKDIR /opt/hivemux/src

# Only what the distribution is built from (pyproject.toml names README.md as its readme).
COPY pyproject.toml setup.py README.md ./
COPY libs ./libs
COPY services ./services
COPY schemas ./schemas

# A regular (non-editable) install: hivemux and hivemux.services.<name> land in site-packages.
# The schemas stay next to it for the embedded broker's schema registry (HIVEMUX_SCHEMAS_DIR).
RUN pip install . \
    && cp -r schemas /opt/hivemux/schemas \
    && rm -rf /opt/hivemux/src \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/hivemux --shell /usr/sbin/nologin hivemux \
    && mkdir -p /var/lib/hivemux \
    && chown hivemux:hivemux /var/lib/hivemux \
    && hivemux topics > /dev/null

# libxcuda.so where hivemux.xcuda.library_path() finds it (native/xcuda/build beside the
# installed package), checked: the executor refuses to start without it.
COPY --from=xcuda /build/native/xcuda/build/libxcuda.so /tmp/libxcuda.so
RUN install -D -m 0755 /tmp/libxcuda.so "$(python -c 'from hivemux.xcuda.library import NATIVE_DIR; print(NATIVE_DIR)')/build/libxcuda.so" \
    && rm /tmp/libxcuda.so \
    && python -c 'from hivemux.xcuda import library_path; print(library_path())'

WORKDIR /var/lib/hivemux
USER 10001:10001

# /healthz and /metrics (HIVEMUX_METRICS_PORT).
EXPOSE 9400

# Each replica names itself after its host unless HIVEMUX_INSTANCE is set, so replicas of one
# service publish under distinct `source`s and client ids (docker compose `deploy.replicas`).
# Kubernetes `command:` replaces this entrypoint; the manifests set HIVEMUX_INSTANCE themselves.
ENTRYPOINT ["/bin/sh", "-c", "export HIVEMUX_INSTANCE=\"${HIVEMUX_INSTANCE:-$(hostname)}\"; exec \"$@\"", "hivemux-entrypoint"]
CMD ["hivemux", "--help"]
