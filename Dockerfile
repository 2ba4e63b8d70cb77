# payauth worker image: multi-stage, non-root, only the runtime dependencies.
# Build: docker build -t payauth .      Run: docker run payauth run | migrate | verify | ...

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
COPY requirements.lock /tmp/requirements.lock
# Hash-checked, pinned: the image gets exactly what CI tested.
RUN /opt/venv/bin/pip install --require-hashes -r /tmp/requirements.lock

FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 payauth \
 && useradd --system --uid 10001 --gid payauth --no-create-home payauth
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY service/ /app/service/
COPY migrations/ /app/migrations/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PAYAUTH_LOG_FORMAT=json \
    PAYAUTH_METRICS_PORT=9100
USER 10001:10001
EXPOSE 9100
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/healthz', timeout=2)"]
# SIGTERM reaches the worker directly (exec form, no shell): it finishes in-flight work,
# commits offsets and leaves the group.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "service"]
CMD ["run"]
