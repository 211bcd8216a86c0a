"""A trained adapter folder -> ``<folder>-bf16``: the LoRA weights train in float32 and ship in bfloat16 (half the
bytes a lent-GPU call returns and the repository holds); the checkpoints are left out. Used by
tools/gpu/judge_esconv.sh and tools/gpu/judge_qwen.sh.

    python3 tools/gpu/adapter_bf16.py ADAPTER_DIR
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file


def main(src: str) -> None:
    """Write ``src + "-bf16"`` (atomically, through a ``.tmp`` folder) unless it exists."""
    dst = src + "-bf16"
    if os.path.isdir(dst):
        return
    shutil.copytree(src, dst + ".tmp", ignore=shutil.ignore_patterns("checkpoint-*"))
    weights = load_file(src + "/adapter_model.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
              dst + ".tmp/adapter_model.safetensors", metadata={"format": "pt"})
    shutil.move(dst + ".tmp", dst)


if __name__ == "__main__":
    main(sys.argv[1])
