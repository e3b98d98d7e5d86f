# One image for the operator and the sweeper:
#   stalledpolicy operator ...   (the chart's operator Deployment)
#   stalledpolicy sweep ...      (each policy's sweeper Deployment)
#
# Two ways build this image. With Docker:
#   docker build -t ghcr.io/stalledpolicy/stalledpolicy-operator:0.1.0 .
# Without a container engine or a registry: `make image` (hack/image/build.py,
# docs/image.md). It reads its recipe from this file's final stage: the Debian
# suite of the FROM line, the packages of the apt-get line (installed by
# mmdebstrap instead), the wheels that COPY brings (built on the host), the
# other RUN lines (run as they are, in a chroot), and USER, ENV, EXPOSE, WORKDIR,
# ENTRYPOINT and CMD for the image's config. Keep the final stage to those
# instructions: the builder refuses any other. tests/unit/test_image_recipe.py
# checks both against each other.
#
# Python is Debian bookworm's python3 (3.11) in both, in the venv /opt/venv.

FROM debian:bookworm-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python3 -m venv /build && /build/bin/pip wheel --no-cache-dir --wheel-dir /wheels .

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# No compilers or build tools here: only the wheels from the build stage.
COPY --from=build /wheels /wheels
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --gid 65532 stalledpolicy \
    && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin stalledpolicy
USER 65532:65532
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the operator's liveness (8080) and metrics (8081) ports; a sweeper's metrics/health port (9090)
EXPOSE 8080 8081 9090
WORKDIR /
ENTRYPOINT ["stalledpolicy"]
CMD ["operator", "--all-namespaces"]
