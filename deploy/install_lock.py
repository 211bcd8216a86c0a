"""Install ``requirements/cpu.lock`` exactly (``pip install --no-deps -r LOCK``) on any machine.

The lock pins ``torch==<version>+cpu``: a build published only on the PyTorch CPU index, not on PyPI. Where pip
is already configured with a local source holding that wheel (a ``find-links`` folder or a ``file://`` index, as
on the project's development machines), the lock is installed as it always was, in one pip call, nothing added.
Anywhere else, the torch pin alone is installed first from the PyTorch CPU index (``--index-url``, so nothing
else can come from there), then the lock from the machine's usual index; pip sees torch already satisfied.

    python deploy/install_lock.py requirements/cpu.lock            # what `make install` and the CPU image run
    python deploy/install_lock.py requirements/cpu.lock --dry-run  # print the decision and the pip commands
    python deploy/install_lock.py requirements/cpu.lock --local-wheel   # print the local wheel's path (or exit 1)
    python deploy/install_lock.py requirements/cpu.lock --cert          # print pip's CA bundle setting (or exit 1)

Run it with the Python of the target environment (the venv's): the wheel must fit that interpreter. Standard
library only: it runs before anything is installed. ``COMPEER_TORCH_INDEX_URL`` replaces the PyTorch index
(a mirror of it).
"""

from __future__ import annotations

import argparse
import html.parser
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

#: Where ``+cpu`` builds of torch are published (the one place this project names it).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_ENV = "COMPEER_TORCH_INDEX_URL"
_PIN = re.compile(r"^torch==(?P<version>\S+\+\S+)\s*$")
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


@dataclass(frozen=True)
class PipSources:
    """The package sources ``pip install`` would use, as pip's configuration and environment set them."""

    find_links: tuple[str, ...] = ()
    index_url: str = "https://pypi.org/simple"
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None  # pip's CA bundle (a TLS-intercepting proxy's); an image build needs it too

    @property
    def indexes(self) -> tuple[str, ...]:
        return () if self.no_index else (self.index_url, *self.extra_index_urls)


@dataclass(frozen=True)
class Target:
    """The interpreter the lock is installed for: its CPython tag (``cp311``) and machine (``x86_64``)."""

    python_tag: str
    machine: str

    @classmethod
    def current(cls) -> Target:
        return cls(f"cp{sys.version_info.major}{sys.version_info.minor}", platform.machine())


@dataclass(frozen=True)
class Plan:
    """How to install the lock: ``torch_index`` is None when pip's own sources already have the torch pin."""

    pin: str
    local_wheel: Path | None
    torch_index: str | None
    reason: str

    def commands(self, python: str, lock: str) -> list[list[str]]:
        pip = [python, "-m", "pip", "install", "-q", "--no-deps"]
        first = [[*pip, "--index-url", self.torch_index, self.pin]] if self.torch_index else []
        return [*first, [*pip, "-r", lock]]


# ------------------------------------------------------------------------------------------ pip's configuration
def parse_pip_config(text: str) -> PipSources:
    """Sources from ``pip config list`` output (``section.key='value'`` lines, ``:env:`` for PIP_* variables).

    pip's own precedence: a PIP_* variable over the config files' ``install`` section over their ``global`` one.
    """
    values: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or "." not in key:
            continue
        section, _, option = key.rpartition(".")
        values[(section, option)] = raw.strip().strip("'\"")

    def get(option: str) -> str | None:
        for section in (":env:", "install", "global"):
            if (section, option) in values:
                return values[(section, option)]
        return None

    no_index = (get("no-index") or "").lower() in ("1", "true", "yes", "on")
    return PipSources(find_links=tuple((get("find-links") or "").split()),
                      index_url=get("index-url") or PipSources.index_url,
                      extra_index_urls=tuple((get("extra-index-url") or "").split()), no_index=no_index,
                      cert=get("cert") or None)


def read_pip_sources(python: str = sys.executable) -> PipSources:
    """The sources the given interpreter's pip uses (its config files and the PIP_* environment)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    return parse_pip_config(out.stdout)


# ------------------------------------------------------------------------------------------ local wheel lookup
class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _local_path(location: str) -> Path | None:
    """A folder or file named by a path or a ``file://`` URL; None for a remote URL."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    if "://" in location:
        return None
    return Path(location)


def _page_links(page: Path) -> list[Path]:
    parser = _Links()
    parser.feed(page.read_text(errors="replace"))
    return [(page.parent / unquote(h.split("#", 1)[0])).resolve() for h in parser.hrefs if "://" not in h]


def _candidates(find_links: Iterable[str], indexes: Iterable[str], project: str) -> list[Path]:
    """Files named by local find-links folders / pages and by local PEP 503 indexes' project pages."""
    files: list[Path] = []
    for loc in find_links:
        path = _local_path(loc)
        if path is None:
            continue
        if path.is_dir():
            files.extend(sorted(path.iterdir()))
        elif path.is_file():
            files.extend(_page_links(path))
    for loc in indexes:
        root = _local_path(loc)
        if root is None:
            continue
        page = root / project
        if (page / "index.html").is_file():
            files.extend(_page_links(page / "index.html"))
        elif page.is_dir():
            files.extend(sorted(page.iterdir()))
    return files


def wheel_fits(filename: str, project: str, version: str, target: Target) -> bool:
    """``filename`` is a wheel of exactly ``project==version`` installable on ``target``."""
    m = _WHEEL.match(filename)
    if m is None or m["name"].lower().replace("_", "-") != project or unquote(m["version"]) != version:
        return False
    py_ok = any(t in (target.python_tag, "py3") for t in m["py"].split("."))
    plat_ok = any(p == "any" or p.endswith("_" + target.machine) for p in m["plat"].split("."))
    return py_ok and plat_ok


def find_local_wheel(pin: str, sources: PipSources, target: Target) -> Path | None:
    """A wheel for ``pin`` (``torch==X+cpu``) in one of pip's local sources, or None."""
    project, _, version = pin.partition("==")
    for f in _candidates(sources.find_links, sources.indexes, project):
        if wheel_fits(f.name, project, version, target) and f.is_file():
            return f
    return None


# ------------------------------------------------------------------------------------------ the decision
def torch_pin(lock_lines: Sequence[str]) -> str:
    """The lock's one ``torch==<version>+<local>`` line (a local build: not on PyPI)."""
    pins = [line.strip() for line in lock_lines if _PIN.match(line.strip())]
    if len(pins) != 1:
        raise ValueError(f"expected exactly one torch==<version>+<build> pin in the lock, found {len(pins)}")
    return pins[0]


def plan(lock_lines: Sequence[str], sources: PipSources, target: Target,
         torch_index: str = TORCH_CPU_INDEX) -> Plan:
    """Where the torch pin comes from: a local pip source when one has it, else the PyTorch index."""
    pin = torch_pin(lock_lines)
    wheel = find_local_wheel(pin, sources, target)
    if wheel is not None:
        return Plan(pin, wheel, None, f"{pin}: found in pip's local sources ({wheel.parent}); lock installed as is")
    if torch_index.rstrip("/") in (u.rstrip("/") for u in sources.indexes):
        return Plan(pin, None, None, f"{pin}: pip is configured with {torch_index}; lock installed as is")
    if sources.no_index:
        raise ValueError(f"{pin} is in no local pip source and pip is set to --no-index: put the wheel in a "
                         f"find-links folder, or allow {torch_index}")
    return Plan(pin, None, torch_index, f"{pin}: not in pip's local sources; installed from {torch_index} first")


def main(argv: Sequence[str] | None = None, *, run: Callable[[list[str]], object] | None = None) -> int:
    p = argparse.ArgumentParser(prog="install_lock.py", description=__doc__.split("\n\n")[0])
    p.add_argument("lock", help="the lock file (requirements/cpu.lock)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the decision and the pip commands only")
    mode.add_argument("--local-wheel", action="store_true",
                      help="print the path of the torch wheel in pip's local sources; exit 1 when there is none")
    mode.add_argument("--cert", action="store_true", help="print pip's CA bundle setting; exit 1 when none is set")
    a = p.parse_args(argv)
    lines = Path(a.lock).read_text().splitlines()
    sources = read_pip_sources()
    if a.cert:
        if sources.cert is None:
            return 1
        print(sources.cert)
        return 0
    decided = plan(lines, sources, Target.current(), os.environ.get(INDEX_ENV) or TORCH_CPU_INDEX)
    if a.local_wheel:
        if decided.local_wheel is None:
            return 1
        print(decided.local_wheel)
        return 0
    print(f"install_lock: {decided.reason}", file=sys.stderr)
    for cmd in decided.commands(sys.executable, a.lock):
        if a.dry_run:
            print(" ".join(cmd))
        else:
            (run or (lambda c: subprocess.run(c, check=True)))(cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
