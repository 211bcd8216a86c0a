"""Deploy tier: the images built and run by a real Docker engine (marker ``deploy``).

``make test`` runs it where a Docker engine answers; where none does, every test here is skipped with the reason
and a ``DeployTierSkipped`` warning in pytest's summary (never silently). ``make test-deploy`` runs it alone;
``.ci/run`` installs and starts an engine when none answers, so CI runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: bound on building the three images (a fresh machine downloads the lock's wheels; a warm layer cache takes ~1 min)
BUILD_TIMEOUT_S = float(os.environ.get("COMPEER_DEPLOY_BUILD_TIMEOUT_S", "1800"))


class DeployTierSkipped(UserWarning):
    """The Docker deploy tests did not run on this machine."""


def engine_problem() -> str | None:
    """Why the deploy tier cannot run here (no client, no engine, no compose), or None when it can."""
    if shutil.which("docker") is None:
        return "no docker client on PATH (apt-get install docker.io)"
    try:
        out = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                             timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 20 s"
    if out.returncode != 0 or not out.stdout.strip():
        return f"no Docker engine answers (`docker info`: {(out.stderr or out.stdout).strip()[:200]}); start dockerd"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed (apt-get install docker-compose)"
    return None


def compose_command() -> list[str] | None:
    """``docker compose`` (the plugin) when it answers, else Debian's ``docker-compose``."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    return [exe] if exe else None


@dataclass(frozen=True)
class Images:
    reward: str
    trainer: str
    redis: str
    build_s: float


@pytest.fixture(scope="session")
def docker_engine() -> None:
    problem = engine_problem()
    if problem is not None:
        warnings.warn(f"deploy tier NOT run: {problem}", DeployTierSkipped, stacklevel=1)
        pytest.skip(f"deploy tier (Docker) not run: {problem}")


@pytest.fixture(scope="session")
def images(docker_engine: None) -> Iterator[Images]:
    """The reward, trainer and Redis images, built the way `make image image-trainer image-redis` builds them."""
    import time

    names = Images(os.environ.get("COMPEER_IMAGE", "compeer-reward:0.1.0-cpu"),
                   os.environ.get("COMPEER_TRAINER_IMAGE", "compeer-trainer:0.1.0-cpu"),
                   os.environ.get("REDIS_IMAGE", "compeer-redis:7"), 0.0)
    t0 = time.monotonic()
    for target, tag in (("runtime", names.reward), ("trainer", names.trainer), ("redis", names.redis)):
        left = BUILD_TIMEOUT_S - (time.monotonic() - t0)
        try:
            out = subprocess.run([str(ROOT / "deploy/docker/build-image.sh"), target, tag], cwd=ROOT,
                                 capture_output=True, text=True, timeout=max(left, 1), check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"building {tag} took longer than COMPEER_DEPLOY_BUILD_TIMEOUT_S={BUILD_TIMEOUT_S:.0f} s")
        assert out.returncode == 0, f"building {tag} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    yield Images(names.reward, names.trainer, names.redis, time.monotonic() - t0)
