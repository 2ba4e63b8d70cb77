# payauth worker image: multi-stage, non-root, only the runtime dependencies.
# Build: make image (any engine, offline too; see docs/containers.md), or
#        docker build -t payauth .
# Run:   docker run payauth run | migrate | verify | topics | replay | explain ...

# BASE_IMAGE: a stand-in of the same Python minor version where the registry is out of
# reach (make image builds one); both stages must use the same one (the venv links to it).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
# .wheelhouse/ (made on the host by make image, or brought by an offline build) is copied
# when it exists; the bracket keeps COPY from failing when it does not.
COPY requirements.lock .wheelhous[e] /tmp/build/
# Hash-checked, pinned: the image gets exactly what CI tested. From the wheelhouse only when
# there is one (no index reached), else from the index. pip and setuptools leave the venv
# afterwards: nothing at run time installs anything.
RUN if ls /tmp/build/*.whl >/dev/null 2>&1; then \
      /opt/venv/bin/pip install --no-index --find-links /tmp/build \
        --require-hashes -r /tmp/build/requirements.lock; \
    else \
      /opt/venv/bin/pip install --require-hashes -r /tmp/build/requirements.lock; \
    fi \
 && /opt/venv/bin/pip uninstall -q -y pip setuptools \
 && find /opt/venv -name '__pycache__' -path '*/pip/*' -prune -exec rm -rf {} +

FROM ${BASE_IMAGE} AS runtime
RUN groupadd --gid 10001 payauth \
 && useradd --uid 10001 --gid payauth --no-create-home --shell /usr/sbin/nologin payauth
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# .dockerignore keeps service/devtools and the tests out.
COPY service/ /app/service/
COPY migrations/ /app/migrations/
COPY sql/ /app/sql/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PAYAUTH_LOG_FORMAT=json \
    PAYAUTH_METRICS_PORT=9100
USER 10001:10001
EXPOSE 9100
# The port the worker serves on, not a fixed one: containers on the host network each
# need their own.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PAYAUTH_METRICS_PORT', '9100'), timeout=2)"]
# SIGTERM reaches the worker directly (exec form, no shell): it finishes in-flight work,
# commits offsets and leaves the group.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "service"]
CMD ["run"]
