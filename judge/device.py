"""What ``device`` and ``dtype`` "auto" mean, in one place: the transformers engine, the default model's conversion
(the server, the trainers) and the judge trainer all resolve them here.

``device`` "auto": ``cuda`` when a GPU is visible, else ``cpu``. ``dtype`` "auto": on a GPU the half precision it
computes in, bfloat16 (float16 on a GPU without bfloat16); on a CPU float32. vLLM resolves its own ``dtype="auto"``
from the model folder's precision and its platform, so the folder this module's dtype produced decides there too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; any other value as given."""
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, torch.dtype]:
    """The device and the torch dtype that ``device`` and ``dtype`` (``auto`` or a torch dtype name) stand for.

    Raises ValueError for a dtype name torch does not know.
    """
    import torch

    dev = resolve_device(device)
    if dtype == "auto":
        if dev.startswith("cuda"):
            return dev, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return dev, torch.float32
    value = getattr(torch, dtype, None)
    if isinstance(value, torch.dtype):
        return dev, value
    raise ValueError(f"dtype {dtype!r}: expected 'auto' or a torch dtype name such as 'bfloat16'")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (the name the model store and configs use)."""
    return str(dtype).removeprefix("torch.")


__all__ = ["dtype_name", "resolve_device", "resolve_device_dtype"]
