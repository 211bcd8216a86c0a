"""Per-candidate result cache: Redis when configured, an in-process LRU otherwise.

The key of a candidate's judgment is the judge library's own (:meth:`judge.conversation.Judge.judgment_key`): a hash
of what decides the answer, taken from what the engine is sent (the messages of every round, as rendered from the
history, the candidate, the reference, the taxonomy and the template; each round's sampling, verdict regex, rationale
and line bounds and logprobs) and from the engine's identity (backend, model, weights digest, adapter, seed), under
the namespace :data:`KEY_PREFIX`. Nothing of the request that does not reach the engine (request id, deadline,
client, options such as ``include_judgment``) and no server setting that does not is in it. A cache failure never
fails a request: it is counted and the request is served uncached.
"""

from __future__ import annotations

import abc
import json
import logging
from typing import Any

from cachetools import TTLCache

from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import ParsedOutput
from judge.conversation import Judge
from reward_server.metrics import Metrics

log = logging.getLogger(__name__)
#: The key namespace; v2: keys are :meth:`Judge.judgment_key` (v1 keys were picked by hand and left out the
#: taxonomy, the backend and the engine's bounds, so no v1 entry is read).
KEY_PREFIX = "compeer:judge:v2:"


def cache_key(judge: Judge, mode: JudgeMode, history: list[Turn], reference: str | None,
              parsed: ParsedOutput) -> str | None:
    """The cache key of the judgment ``judge`` gives the candidate ``parsed`` (what it is shown of it) in ``mode``;
    None when nothing of it is judged (no round reaches the engine): such a candidate is neither looked up nor
    stored."""
    key = judge.judgment_key(history, reference, parsed, mode)
    return None if key is None else KEY_PREFIX + key


class ResultCache(abc.ABC):
    """Stores JSON-able judgment records by key."""

    kind: str = "off"

    @abc.abstractmethod
    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        """Values for ``keys`` (None where absent or on a backend failure)."""

    @abc.abstractmethod
    async def set_many(self, items: dict[str, dict[str, Any]]) -> None:
        """Store values; failures are counted, never raised."""

    async def close(self) -> None:
        return None


class NoCache(ResultCache):
    kind = "off"

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        return [None] * len(keys)

    async def set_many(self, items: dict[str, dict[str, Any]]) -> None:
        return None


class MemoryCache(ResultCache):
    """In-process LRU with a TTL (cachetools)."""

    kind = "memory"

    def __init__(self, max_entries: int = 100_000, ttl_s: float = 86_400) -> None:
        self._data: TTLCache[str, str] = TTLCache(maxsize=max_entries, ttl=ttl_s)

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        return [json.loads(v) if (v := self._data.get(k)) is not None else None for k in keys]

    async def set_many(self, items: dict[str, dict[str, Any]]) -> None:
        for k, v in items.items():
            self._data[k] = json.dumps(v)


class RedisCache(ResultCache):
    """redis.asyncio with MGET / pipelined SETEX; errors are counted in ``compeer_cache_errors_total``."""

    kind = "redis"

    def __init__(self, url: str, metrics: Metrics, ttl_s: float = 86_400, timeout_s: float = 0.5) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._metrics = metrics
        self._ttl = max(1, int(ttl_s))
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        if not keys:
            return []
        try:
            raw = await self._redis.mget(keys)
        except self._errors as exc:
            self._metrics.cache_errors.labels("get").inc()
            log.warning("redis get failed, serving uncached: %s", type(exc).__name__)
            return [None] * len(keys)
        return [None if v is None else json.loads(v) for v in raw]

    async def set_many(self, items: dict[str, dict[str, Any]]) -> None:
        if not items:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for k, v in items.items():
                    pipe.setex(k, self._ttl, json.dumps(v))
                await pipe.execute()
        except self._errors as exc:
            self._metrics.cache_errors.labels("set").inc()
            log.warning("redis set failed, result not cached: %s", type(exc).__name__)

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except self._errors:
            return False

    async def close(self) -> None:
        await self._redis.aclose()
