"""Fakes for unit tests of the reward service, named as such: a scripted judge and a hash embedder."""

from __future__ import annotations

import hashlib

import numpy as np

from judge.engines.base import GenParams, Message
from reward_server.embeddings import Embedder


class FakeHashEmbedder(Embedder):
    """FAKE: deterministic unit vectors from a text hash (identical texts -> cosine 1)."""

    model_id = "fake-hash-embedder"

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16))
            v = rng.normal(size=16)
            out[i] = v / np.linalg.norm(v)
        return out


def scripted_judge(step: str = "True", preference: str = "second"):
    """FAKE judge responder: answers every asked component with the given labels, in the judge grammar."""

    def respond(messages: list[Message], params: GenParams) -> str:
        user = messages[-1]["content"]
        lines = []
        for block in user.split("<<<")[1:]:
            lines.append(f"Rationale: looks fine.\nVerdict: {step}")
        if "Reply 2 (second)" in user:
            lines = lines[:-2] + [f"Rationale: compared.\nVerdict: {preference}"]
        return "\n".join(lines)

    return respond
