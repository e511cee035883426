#!/usr/bin/env bash
# Make the raftmq image's base locally where no image registry is reachable:
#   debootstrap Debian bookworm (python3.11 + venv) -> docker import -> raftmq-base:bookworm
# and download the Python wheels raftmq needs into docker/wheels (the image build installs them
# with pip --no-index).  Then:
#   RAFTMQ_BASE_IMAGE=raftmq-base:bookworm docker-compose build
# Needs root, debootstrap, docker (dockerd running) and a Debian mirror (MIRROR, default
# deb.debian.org).  Elsewhere, skip this: the Dockerfile's default base is python:3.11-slim.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-raftmq-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}

if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG exists"
else
    rootfs=$(mktemp -d /tmp/raftmq-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$MIRROR"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$TAG"
    echo "imported $TAG"
fi

# Wheels for the image, built on this host (CPython 3.11 on glibc x86_64, as bookworm's python3.11):
# binary wheels where the index has them, pure-Python ones built from sdists (pysyncobj).
mkdir -p docker/wheels
"$PYTHON" -m pip wheel --quiet --wheel-dir docker/wheels "setuptools>=68" wheel .
echo "wheels in docker/wheels: $(ls docker/wheels | wc -l)"
