# One image for the operator and the sweeper:
#   stalledpolicy operator ...   (the chart's operator Deployment)
#   stalledpolicy sweep ...      (each policy's sweeper Deployment)
# Build: docker build -t ghcr.io/stalledpolicy/stalledpolicy-operator:0.1.0 .

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# No compilers or build tools here: only the wheels from the build stage.
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin stalledpolicy
USER 65532:65532
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the operator's liveness (8080) and metrics (8081) ports; a sweeper's metrics/health port (9090)
EXPOSE 8080 8081 9090
ENTRYPOINT ["stalledpolicy"]
CMD ["operator", "--all-namespaces"]
