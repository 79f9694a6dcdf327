# evalsi as a container: `docker build -t evalsi:0.1.0 .` at the repo root (docs/deploy.md).
# OTLP in on 4317 (gRPC) and 4318 (HTTP), the API on 8080 (/healthz, /readyz), self-metrics on 8888, the embedded
# store on the /var/lib/evalsi volume. Mount another config over /etc/evalsi/evalsi.yaml to change any of it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY evalsi ./evalsi
# Every dependency has a manylinux wheel (x86_64 and aarch64): --only-binary makes a dependency that would need a
# compiler fail the build here instead of looking for gcc, which the slim image does not have.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/evalsi \
 && /opt/evalsi/bin/pip install --only-binary=:all: /wheels/evalsi-*.whl

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 evalsi \
 && useradd --system --uid 10001 --gid evalsi --home-dir /var/lib/evalsi --no-create-home \
      --shell /usr/sbin/nologin evalsi \
 && mkdir -p /var/lib/evalsi /etc/evalsi \
 && chown evalsi:evalsi /var/lib/evalsi
COPY --from=build /opt/evalsi /opt/evalsi
COPY deploy/evalsi.yaml /etc/evalsi/evalsi.yaml
COPY deploy/policies /etc/evalsi/policies
# deploy/evalsi.yaml binds 0.0.0.0, reads its store from EVALSI_STORE and the hash of its API key from
# EVALSI_API_KEY_HASH, which has no default: `docker run -e EVALSI_API_KEY_HASH=sha256:...` (docs/deploy.md). The
# working directory is the volume, so relative paths (evaluate's datasets_dir, .evalsi/datasets) land on it too.
ENV PATH=/opt/evalsi/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/evalsi \
    EVALSI_STORE=chdb:///var/lib/evalsi/store
WORKDIR /var/lib/evalsi
VOLUME ["/var/lib/evalsi"]
USER 10001:10001
EXPOSE 4317 4318 8080 8888
# the slim image has no curl: Python's urllib raises (exit 1) on a refused connection or a non-2xx answer
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["evalsi", "serve"]
CMD ["-c", "/etc/evalsi/evalsi.yaml"]
