"""deploy/install_lock.py: where the lock's +cpu torch comes from, decided from pip's configuration.

Faked environments: pip configurations given as ``pip config list`` text, and temporary folders holding empty
files named like wheels (a find-links folder, a file:// PEP 503 index). The last tests run the real pip of this
interpreter under a faked environment (no config files, PIP_* variables only). What is not tested here: an
install on a machine without the local wheel folders, end to end (it needs the PyTorch index, which this machine
cannot reach); docs/deploy.md says so.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "install_lock.py"
LOCK = ["numpy==2.3.1", "torch==2.13.0+cpu", "transformers==5.19.0"]
PIN = "torch==2.13.0+cpu"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_lock", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["install_lock"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


il = _load()
TARGET = il.Target("cp311", "x86_64")


def _folder(tmp_path: Path, *names: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for n in names:
        (tmp_path / n).write_bytes(b"")
    return tmp_path


def _simple_index(root: Path, project: str, filenames: list[str]) -> Path:
    """A PEP 503 index as /opt/pypi lays it out: simple/<project>/index.html linking ../../files/<wheel>."""
    files = root / "files"
    files.mkdir(parents=True)
    page = root / "simple" / project
    page.mkdir(parents=True)
    links = []
    for name in filenames:
        (files / name).write_bytes(b"")
        links.append(f'<a href="../../files/{name.replace("+", "%2B")}#sha256=00">{name}</a>')
    (page / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    return root / "simple"


# ------------------------------------------------------------------------------------------------ pip config
def test_parse_pip_config_follows_pips_precedence() -> None:
    text = """global.find-links='/opt/wheels'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.index-url='https://mirror.example/simple'
install.index-url='https://install.example/simple'
:env:.find-links='/env/wheels /more'
global.cert='/etc/ssl/certs/ca-certificates.crt'
"""
    s = il.parse_pip_config(text)
    assert s.find_links == ("/env/wheels", "/more")  # PIP_FIND_LINKS replaces the config files' value
    assert s.index_url == "https://install.example/simple"  # the install section beats global
    assert s.extra_index_urls == ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    assert not s.no_index
    assert s.indexes == ("https://install.example/simple", "file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    assert s.cert == "/etc/ssl/certs/ca-certificates.crt"


def test_parse_empty_config_is_pypi_only() -> None:
    s = il.parse_pip_config("")
    assert s == il.PipSources() and s.indexes == ("https://pypi.org/simple",) and s.find_links == ()
    assert il.parse_pip_config(":env:.no-index='1'").indexes == ()


# ------------------------------------------------------------------------------------------------ local wheels
def test_wheel_fits_checks_name_version_python_and_machine() -> None:
    assert il.wheel_fits(WHEEL, "torch", "2.13.0+cpu", TARGET)
    assert il.wheel_fits(WHEEL.replace("+", "%2B"), "torch", "2.13.0+cpu", TARGET)
    assert not il.wheel_fits(WHEEL, "torch", "2.13.0", TARGET)  # the PyPI build is not the pin
    assert not il.wheel_fits(WHEEL, "torch", "2.13.0+cpu", il.Target("cp312", "x86_64"))
    assert not il.wheel_fits(WHEEL, "torch", "2.13.0+cpu", il.Target("cp311", "aarch64"))
    assert not il.wheel_fits("torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl", "torch", "0.28.0", TARGET)
    assert not il.wheel_fits("torch-2.13.0+cpu.tar.gz", "torch", "2.13.0+cpu", TARGET)


def test_wheel_in_a_find_links_folder_is_used_as_is(tmp_path: Path) -> None:
    wheels = _folder(tmp_path / "wheels", WHEEL, "other-1.0-py3-none-any.whl")
    sources = il.PipSources(find_links=(str(wheels),))
    p = il.plan(LOCK, sources, TARGET)
    assert p.local_wheel == wheels / WHEEL and p.torch_index is None
    assert p.commands("py", "cpu.lock") == [["py", "-m", "pip", "install", "-q", "--no-deps", "-r", "cpu.lock"]]


def test_wheel_in_a_local_file_index_is_used_as_is(tmp_path: Path) -> None:
    simple = _simple_index(tmp_path / "pypi", "torch", ["torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", WHEEL])
    sources = il.PipSources(extra_index_urls=(simple.as_uri(),))
    p = il.plan(LOCK, sources, TARGET)
    assert p.local_wheel == (tmp_path / "pypi" / "files" / WHEEL).resolve() and p.torch_index is None


def test_a_find_links_html_page_is_read(tmp_path: Path) -> None:
    _folder(tmp_path / "w", WHEEL)
    page = tmp_path / "w" / "links.html"
    page.write_text(f'<a href="{WHEEL}">torch</a>')
    assert il.plan(LOCK, il.PipSources(find_links=(page.as_uri(),)), TARGET).local_wheel == (tmp_path / "w" / WHEEL)


def test_no_local_wheel_means_the_pytorch_index_first(tmp_path: Path) -> None:
    # a local folder with only other builds, a local index without torch, and a remote find-links page
    wheels = _folder(tmp_path / "wheels", "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
                     "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    simple = _simple_index(tmp_path / "pypi", "numpy", ["numpy-2.3.1-cp311-cp311-manylinux_2_28_x86_64.whl"])
    sources = il.PipSources(find_links=(str(wheels), "https://example.org/wheels/", str(tmp_path / "missing")),
                            extra_index_urls=(simple.as_uri(),))
    p = il.plan(LOCK, sources, TARGET)
    assert p.local_wheel is None and p.torch_index == il.TORCH_CPU_INDEX == "https://download.pytorch.org/whl/cpu"
    assert p.commands("py", "cpu.lock") == [
        ["py", "-m", "pip", "install", "-q", "--no-deps", "--index-url", il.TORCH_CPU_INDEX, PIN],
        ["py", "-m", "pip", "install", "-q", "--no-deps", "-r", "cpu.lock"],
    ]
    mirror = il.plan(LOCK, sources, TARGET, torch_index="https://mirror.example/torch-cpu")
    assert mirror.torch_index == "https://mirror.example/torch-cpu"


def test_pip_already_configured_with_the_pytorch_index() -> None:
    sources = il.PipSources(extra_index_urls=(il.TORCH_CPU_INDEX + "/",))
    p = il.plan(LOCK, sources, TARGET)
    assert p.torch_index is None and p.local_wheel is None and len(p.commands("py", "l")) == 1


def test_no_index_without_a_local_wheel_is_an_error_naming_the_remedy() -> None:
    with pytest.raises(ValueError, match="no-index"):
        il.plan(LOCK, il.PipSources(no_index=True), TARGET)


def test_the_lock_must_pin_exactly_one_local_torch_build() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        il.torch_pin(["torch==2.13.0"])
    with pytest.raises(ValueError, match="found 2"):
        il.torch_pin([PIN, "torch==2.14.0+cpu"])
    real = (ROOT / "requirements" / "cpu.lock").read_text().splitlines()
    assert il.torch_pin(real).startswith("torch==") and il.torch_pin(real).endswith("+cpu")


# ------------------------------------------------------------------------------------------------ the CLI
def test_main_runs_the_planned_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "cpu.lock"
    lock.write_text("\n".join(LOCK) + "\n")
    monkeypatch.setattr(il, "read_pip_sources", lambda: il.PipSources())
    monkeypatch.setattr(il.Target, "current", classmethod(lambda cls: TARGET))
    monkeypatch.setenv(il.INDEX_ENV, "https://mirror.example/cpu")
    ran: list[list[str]] = []
    assert il.main([str(lock)], run=ran.append) == 0
    assert [c[-1] for c in ran] == [PIN, str(lock)] and "https://mirror.example/cpu" in ran[0]
    assert "installed from https://mirror.example/cpu first" in capsys.readouterr().err
    assert il.main([str(lock), "--local-wheel"]) == 1


def _run_script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The script under this interpreter's real pip, with config files off and only the given PIP_* set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != il.INDEX_ENV}
    clean.update({"PIP_CONFIG_FILE": os.devnull, **env})
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=clean,
                          timeout=60, check=False)


def test_real_pip_config_with_a_local_folder(tmp_path: Path) -> None:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    import platform

    name = f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_{platform.machine()}.whl"
    wheels = _folder(tmp_path / "wheels", name)
    lock = tmp_path / "cpu.lock"
    lock.write_text("\n".join(LOCK) + "\n")
    found = _run_script({"PIP_FIND_LINKS": str(wheels)}, str(lock), "--local-wheel")
    assert found.returncode == 0 and found.stdout.strip() == str(wheels / name), found.stderr
    dry = _run_script({"PIP_FIND_LINKS": str(wheels)}, str(lock), "--dry-run")
    assert dry.stdout.splitlines() == [f"{sys.executable} -m pip install -q --no-deps -r {lock}"], dry.stderr
    cert = _run_script({"PIP_FIND_LINKS": str(wheels), "PIP_CERT": "/srv/proxy-ca.pem"}, str(lock), "--cert")
    assert cert.stdout.strip() == "/srv/proxy-ca.pem"


def test_real_pip_config_on_a_fresh_machine(tmp_path: Path) -> None:
    lock = tmp_path / "cpu.lock"
    lock.write_text("\n".join(LOCK) + "\n")
    assert _run_script({}, str(lock), "--local-wheel").returncode == 1
    assert _run_script({}, str(lock), "--cert").returncode == 1
    dry = _run_script({}, str(lock), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0].endswith(f"--index-url {il.TORCH_CPU_INDEX} {PIN}")
    assert "not in pip's local sources" in dry.stderr
