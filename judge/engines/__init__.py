"""Engine backends behind one interface (:class:`judge.engines.base.Engine`).

Engines are imported lazily by name so that a machine without vLLM can still serve with transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from judge.engines.base import BACKENDS

if TYPE_CHECKING:
    from judge.engines.base import Engine, EngineConfig

__all__ = ["BACKENDS", "create_engine"]


def create_engine(config: EngineConfig) -> Engine:
    """Instantiate the backend named by ``config.backend`` (its heavy imports happen in ``start``)."""
    if config.backend == "vllm":
        from judge.engines.vllm_engine import VllmEngine

        return VllmEngine(config)
    if config.backend == "transformers":
        from judge.engines.hf.engine import TransformersEngine

        return TransformersEngine(config)
    if config.backend == "openai":
        from judge.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(config)
    raise ValueError(f"backend {config.backend!r}: expected one of {', '.join(BACKENDS)}")
