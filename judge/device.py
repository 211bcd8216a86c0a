"""What ``device`` and ``dtype`` "auto" mean, in one place (engines, the model store and the trainers use it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, torch.dtype]:
    """``device`` "auto" → cuda when available, else cpu; ``dtype`` "auto" → bfloat16 on cuda, float32 on cpu."""
    import torch

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dtype == "auto":
        return dev, (torch.bfloat16 if dev.startswith("cuda") else torch.float32)
    value = getattr(torch, dtype, None)
    if isinstance(value, torch.dtype):
        return dev, value
    raise ValueError(f"dtype {dtype!r}: expected 'auto' or a torch dtype name such as 'bfloat16'")
