# raftmq node image. The base is an argument: python:3.11-slim where a registry is reachable, or a
# locally imported Debian bookworm rootfs (which has python3.11) where none is:
# docker/make-base-image.sh, then RAFTMQ_BASE_IMAGE=raftmq-base:bookworm docker-compose build.
ARG BASE=python:3.11-slim
FROM ${BASE}
WORKDIR /opt/raftmq
COPY pyproject.toml README.md ./
COPY raftmq raftmq
COPY protocol protocol
COPY store store
COPY raft raft
COPY node node
COPY ops ops
COPY spark spark
COPY client client
# Wheels may be provided in docker/wheels for hosts without package index access
# (docker/make-base-image.sh downloads them): pip then installs with --no-index.
COPY docker/wheels* /opt/wheels/
# A virtualenv: Debian's python3 refuses pip installs into the system (PEP 668).
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir $( [ -n "$(ls /opt/wheels/*.whl 2>/dev/null)" ] && echo --no-index --find-links /opt/wheels ) . \
    && rm -rf /opt/wheels
ENV PATH=/opt/venv/bin:$PATH
EXPOSE 5672 4401 15672 15680 15692
HEALTHCHECK --interval=5s --timeout=3s --retries=5 CMD python3 -c "import socket; s = socket.create_connection(('127.0.0.1', 5672), 2); s.sendall(b'AMQP\x00\x00\x09\x01'); assert s.recv(8)"
ENTRYPOINT ["raftmq", "server", "--config", "/etc/raftmq/cluster.toml", "--host", "0.0.0.0", "--port", "5672", "--data-dir", "/data", "--metrics-port", "15692", "--admin-port", "15680", "--http-port", "15672"]
