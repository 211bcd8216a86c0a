#!/usr/bin/env bash
# Build an offline stand-in for the official `python:3.11-slim-bookworm` image from Debian's own packages
# (debootstrap + docker import), for machines where no image registry answers. Same Debian release, the same
# Python minor version (Debian bookworm's python3.11), the same commands (`python`, `python3`, `python -m venv`),
# Python.h present, LANG=C.UTF-8, /var/lib/apt/lists emptied as in the official image.
#
#   deploy/docker/base/build-base.sh IMAGE_TAG           e.g. compeer-local/python:3.11-slim-bookworm
#
# Needs root, debootstrap (apt-get install debootstrap) and a Debian mirror (DEBIAN_MIRROR, default: deb.debian.org).
set -euo pipefail
tag=${1:?usage: build-base.sh IMAGE_TAG}
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || { echo "build-base.sh: debootstrap is missing (apt-get install -y debootstrap)" >&2; exit 1; }

rootfs=$(mktemp -d /tmp/compeer-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
# python3.11-dev: Python.h (the official image has the headers; torch.compile builds against them at run time).
debootstrap --variant=minbase \
    --include=ca-certificates,python3.11,python3.11-venv,python3.11-dev,python-is-python3,python3-venv \
    "$suite" "$rootfs" "$mirror" >&2
# What the official slim image leaves out: apt lists, docs, man pages, caches, logs.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
       "$rootfs"/usr/lib/python3.11/config-3.11-*/libpython3.11*.a \
       "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/log/* "$rootfs"/tmp/*
# The image's apt sources: the release, its updates and security updates, as in the official image.
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
    "$mirror" "$suite" "$mirror" "$suite" "$security" "$suite" > "$rootfs/etc/apt/sources.list"
tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --message "debootstrap $suite minbase + python3.11 (offline stand-in for python:3.11-slim-$suite)" \
    - "$tag" >&2
docker run --rm --network none "$tag" python -c "import sys, sysconfig, os, venv; assert sys.version_info[:2] == (3, 11); assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"
echo "$tag"
