"""The static KV cache of the transformers engine (``TransformersSettings.static_cache``, for CUDA graphs).

With the static cache transformers auto-compiles the decode step with ``torch.compile`` (CUDA graphs); every batch
is then filled to ``max_batch`` rows (filler rows are marked finished from the first step) so the compiled decode
graph keeps one batch shape, and :class:`StaticKV` keeps one cache object that every call reuses.
"""

from __future__ import annotations

import gc
from typing import Any


class StaticKV:
    """The static KV cache for a call needing ``length`` positions: one cache object reused (reset) by every call,
    so its tensors keep their addresses.

    transformers' own ``cache_implementation="static"`` builds a new cache per ``generate`` call; its new tensors are
    static inputs of the compiled decode graph, and torch.compile's CUDA-graph trees re-record the graph when those
    addresses change (and stop using graphs for it after ``cudagraph_unexpected_rerecord_limit`` re-records). A
    longer call grows the cache (to a multiple of 256 positions, at most ``max_model_len``), which happens a few
    times per process.
    """

    def __init__(self, model_config: Any, max_model_len: int) -> None:
        self._model_config = model_config
        self._max_model_len = max_model_len
        self.cache: Any = None
        self.length = 0

    def get(self, length: int) -> Any:
        """The cache, reset, with room for at least ``length`` positions (grown when needed)."""
        from transformers import StaticCache

        if self.cache is None or self.length < length:
            self.length = min(self._max_model_len, -(-length // 256) * 256)
            self.cache = None
            gc.collect()
            self.cache = StaticCache(config=self._model_config, max_cache_len=self.length)
        else:
            self.cache.reset()  # zeroes the layers' tensors in place (a layer not yet initialised is skipped)
        return self.cache

    def clear(self) -> None:
        """Drop the cache (the engine is stopping)."""
        self.cache, self.length = None, 0
