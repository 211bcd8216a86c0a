#!/usr/bin/env bash
# `make image` / `make image-trainer` / `make image-redis`: build an image of the compose stack with BuildKit.
#
#   deploy/docker/build-image.sh runtime|trainer TAG     deploy/docker/Dockerfile.cpu, that target
#   deploy/docker/build-image.sh redis TAG               the official redis image (REDIS_UPSTREAM) tagged TAG when
#                                                        present or pullable, else deploy/docker/Dockerfile.redis
#
# 1. A Docker client that builds with BuildKit: `docker` with the buildx plugin (Docker >= 23), else a Docker
#    20.10 client on PATH (its BuildKit is built in; Debian 12's docker.io), with DOCKER_BUILDKIT=1.
# 2. The base image: PYTHON_IMAGE (default python:3.11-slim-bookworm) when present or pullable; when no registry
#    answers, an equivalent built offline from Debian's packages (deploy/docker/base/build-base.sh), once.
# 3. The lock's +cpu torch: linked into deploy/docker/wheels/ when this machine's pip has it in a local folder
#    (deploy/install_lock.py --local-wheel, the same decision `make install` makes); else the build fetches it
#    from the PyTorch CPU index.
# 4. pip's CA bundle (its `cert` setting or PIP_CERT) as the build secret `pip_cert`, when one is set.
# Env: PYTHON_IMAGE, LOCAL_BASE_IMAGE, PY (a Python of the lock's version, for the wheel lookup), DOCKER.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:?usage: build-image.sh TARGET TAG}
tag=${2:?usage: build-image.sh TARGET TAG}
base=${PYTHON_IMAGE:-python:3.11-slim-bookworm}
local_base=${LOCAL_BASE_IMAGE:-compeer-local/python:3.11-slim-bookworm}
py=${PY:-python3}

pick_docker() {
    if [[ -n "${DOCKER:-}" ]]; then echo "$DOCKER"; return; fi
    if docker buildx version >/dev/null 2>&1; then echo docker; return; fi
    local c v
    for c in $(type -ap docker); do
        v=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)
        if [[ "$v" =~ ^([0-9]+)\. ]] && (( BASH_REMATCH[1] < 23 )); then echo "$c"; return; fi
    done
    echo "build-image: no Docker client here builds with BuildKit: install the buildx plugin (docker-buildx)," \
         "or Docker 20.10 (apt-get install docker.io)" >&2
    return 1
}
docker_cli=$(pick_docker)
export DOCKER_BUILDKIT=1

if ! "$docker_cli" image inspect "$base" >/dev/null 2>&1 && ! timeout 300 "$docker_cli" pull -q "$base" >/dev/null 2>&1; then
    echo "build-image: no registry answers for $base; using $local_base, built offline from Debian packages" >&2
    "$docker_cli" image inspect "$local_base" >/dev/null 2>&1 || deploy/docker/base/build-base.sh "$local_base" >/dev/null
    base=$local_base
fi

if [[ "$target" == redis ]]; then
    upstream=${REDIS_UPSTREAM:-redis:7-bookworm}
    if "$docker_cli" image inspect "$upstream" >/dev/null 2>&1 || timeout 300 "$docker_cli" pull -q "$upstream" >/dev/null 2>&1; then
        "$docker_cli" tag "$upstream" "$tag"
    else
        echo "build-image: no registry answers for $upstream; Debian's redis-server on $base" >&2
        "$docker_cli" build -q -f deploy/docker/Dockerfile.redis --build-arg "BASE_IMAGE=$base" -t "$tag" deploy/docker >/dev/null
    fi
    exit 0
fi

rm -f deploy/docker/wheels/*.whl
if wheel=$("$py" deploy/install_lock.py requirements/cpu.lock --local-wheel); then
    ln -f "$wheel" deploy/docker/wheels/ 2>/dev/null || cp "$wheel" deploy/docker/wheels/
    echo "build-image: torch from this machine's $(dirname "$wheel")" >&2
else
    echo "build-image: torch from the PyTorch CPU index (no local wheel)" >&2
fi

# pip's CA bundle, for a build behind a TLS-intercepting proxy.
secret=()
cert=$("$py" deploy/install_lock.py requirements/cpu.lock --cert || true)
if [[ -n "$cert" && -s "$cert" ]]; then secret=(--secret "id=pip_cert,src=$cert"); fi

previous=$("$docker_cli" image inspect "$tag" --format '{{.Id}}' 2>/dev/null || true)
"$docker_cli" build -f deploy/docker/Dockerfile.cpu --target "$target" --build-arg "PYTHON_IMAGE=$base" \
    "${secret[@]}" -t "$tag" .
"$docker_cli" image inspect "$tag" --format "build-image: $tag {{.Size}} bytes" >&2
# the image this build replaced under the tag is untagged now: remove it (4-6 GB a rebuild otherwise piles up)
if [[ -n "$previous" && "$previous" != "$("$docker_cli" image inspect "$tag" --format '{{.Id}}')" ]]; then
    "$docker_cli" rmi "$previous" >/dev/null 2>&1 || echo "build-image: kept the replaced image $previous (in use)" >&2
fi
