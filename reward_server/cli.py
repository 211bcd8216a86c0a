"""``compeer-reward serve`` (run the service) and ``compeer-reward score FILE.json`` (a client call)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from reward_server.config import CACHE_KINDS, ServerConfig
from reward_server.engines import BACKENDS
from reward_server.engines.base import EngineConfig
from reward_server.engines.hf_engine import GRAMMAR_BACKENDS, GRAMMAR_KERNELS
from reward_server.judge import DEFAULT_TEMPLATE, JudgeSettings
from reward_server.types import SCORE_MODES, JudgeMode, Limits


def _env(name: str, default: Any) -> Any:
    return os.environ.get(name, default)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compeer-reward", description="UnifiReward judge service (gRPC + HTTP).")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve the judge over gRPC and HTTP",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("--backend", choices=BACKENDS, default=_env("COMPEER_BACKEND", "vllm"),
                   help="engine (env COMPEER_BACKEND)")
    s.add_argument("--model", default=_env("COMPEER_MODEL", "default"),
                   help="'default' (embedded SmolLM2-135M-Instruct) or an HF folder (env COMPEER_MODEL)")
    s.add_argument("--adapter", default=_env("COMPEER_ADAPTER", None), help="PEFT LoRA folder (env COMPEER_ADAPTER)")
    s.add_argument("--host", default=_env("COMPEER_HOST", "0.0.0.0"))
    s.add_argument("--grpc-port", type=int, default=int(_env("COMPEER_GRPC_PORT", 50051)))
    s.add_argument("--http-port", type=int, default=int(_env("COMPEER_HTTP_PORT", 8000)))
    s.add_argument("--redis-url", default=_env("REDIS_URL", None), help="Redis cache (env REDIS_URL)")
    s.add_argument("--cache", choices=CACHE_KINDS, default=_env("COMPEER_CACHE_KIND", "auto"),
                   help="auto: redis when a URL is set, else in-process memory")
    s.add_argument("--cache-ttl-s", type=float, default=86_400.0)
    s.add_argument("--template", default=DEFAULT_TEMPLATE, help="judge template version or YAML path")
    s.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML (default: ESConv's eight)")
    s.add_argument("--default-mode", choices=[m.value for m in SCORE_MODES], default="unified")
    s.add_argument("--seed", type=int, default=0, help="engine seed")
    s.add_argument("--temperature", type=float, default=0.0, help="judge temperature (0: greedy, cacheable)")
    s.add_argument("--max-retries", type=int, default=2, help="re-generations of an unparsable round")
    s.add_argument("--max-tokens-per-component", type=int, default=96)
    s.add_argument("--no-constrain", action="store_true", help="do not constrain the verdict grammar")
    s.add_argument("--max-candidates", type=int, default=64)
    s.add_argument("--max-groups", type=int, default=256)
    s.add_argument("--max-text-chars", type=int, default=8000)
    s.add_argument("--max-history-turns", type=int, default=64)
    s.add_argument("--judge-timeout-s", type=float, default=120.0, help="per-candidate judge limit")
    s.add_argument("--default-timeout-s", type=float, default=300.0, help="per-request limit without a deadline")
    s.add_argument("--shutdown-grace-s", type=float, default=30.0,
                   help="on SIGTERM, in-flight gRPC calls get this long before they are cancelled")
    s.add_argument("--max-model-len", type=int, default=4096)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    s.add_argument("--kv-cache-gib", type=float, default=None,
                   help="vllm KV cache size (default: 2 GiB on CPU; on GPU --gpu-memory-utilization decides)")
    s.add_argument("--device", default="auto", help="transformers backend: auto | cpu | cuda")
    s.add_argument("--max-batch", type=int, default=32, help="transformers backend micro-batch size")
    s.add_argument("--static-cache", action="store_true",
                   help="transformers backend on CUDA: static KV cache + torch.compile (see docs/reward_server.md)")
    s.add_argument("--grammar-backend", default=None, choices=tuple(GRAMMAR_BACKENDS),
                   help="transformers backend: the library that computes the verdict masks (default xgrammar)")
    s.add_argument("--grammar-kernel", default=None,
                   choices=GRAMMAR_KERNELS,
                   help="transformers backend: xgrammar's mask-apply kernel (default auto: Triton on CUDA, native on CPU)")
    s.add_argument("--grammar-threads", type=int, default=None,
                   help="transformers backend: threads filling a batch's verdict masks (default 1; more only pays for "
                        "grammars with long counted repetitions, see bench.grammar_fill)")
    s.add_argument("--no-line-bound", action="store_true",
                   help="transformers backend: bound the judge's rationale with a counted repetition in the grammar "
                        "(as on vLLM) instead of the engine's line bound")
    s.add_argument("--max-wait-ms", type=float, default=5.0, help="transformers backend micro-batch wait")
    s.add_argument("--openai-base-url", default=_env("OPENAI_BASE_URL", None))
    s.add_argument("--openai-api-key", default=_env("OPENAI_API_KEY", None))
    s.add_argument("--openai-model", default=None)
    s.add_argument("--openai-regex", action="store_true", help="the endpoint is vLLM: send structured outputs")
    s.add_argument("--embedding-model", default="default", help="'default', an HF folder, or 'off'")
    s.add_argument("--log-level", default=_env("COMPEER_LOG_LEVEL", "INFO"))

    c = sub.add_parser("score", help="score a group from a JSON file (the POST /v1/score body) and print the result")
    c.add_argument("file", help="JSON file: {history, reference, candidates, options}")
    c.add_argument("--address", action="append", default=None,
                   help="gRPC host:port (repeatable; default localhost:50051 or env COMPEER_ADDRESS)")
    c.add_argument("--timeout-s", type=float, default=300.0)
    c.add_argument("--include-judgment", action="store_true")
    return p


def engine_extra(a: argparse.Namespace) -> dict[str, str]:
    """Backend options without a field of their own in EngineConfig (see each engine's docstring)."""
    extra = {"static_cache": "true"} if a.static_cache else {}
    if a.grammar_kernel:
        extra["grammar_kernel"] = a.grammar_kernel
    if a.grammar_backend:
        extra["grammar_backend"] = a.grammar_backend
    if a.grammar_threads:
        extra["grammar_threads"] = str(a.grammar_threads)
    if a.no_line_bound:
        extra["line_bound"] = "false"
    return extra


def config_from_args(a: argparse.Namespace) -> ServerConfig:
    engine = EngineConfig(
        backend=a.backend, adapter=a.adapter, seed=a.seed, max_model_len=a.max_model_len, device=a.device,
        gpu_memory_utilization=a.gpu_memory_utilization, kv_cache_gib=a.kv_cache_gib, max_batch=a.max_batch, max_wait_ms=a.max_wait_ms,
        base_url=a.openai_base_url, api_key=a.openai_api_key, openai_model=a.openai_model,
        openai_regex=a.openai_regex, extra=engine_extra(a))
    judge = JudgeSettings(max_tokens_per_component=a.max_tokens_per_component, temperature=a.temperature,
                          max_retries=a.max_retries, constrain=not a.no_constrain)
    limits = Limits(max_candidates=a.max_candidates, max_groups=a.max_groups, max_history_turns=a.max_history_turns,
                    max_text_chars=a.max_text_chars)
    return ServerConfig(engine=engine, model=a.model, host=a.host, grpc_port=a.grpc_port, http_port=a.http_port,
                        redis_url=a.redis_url, cache=a.cache, cache_ttl_s=a.cache_ttl_s, template=a.template,
                        taxonomy=a.taxonomy, default_mode=JudgeMode(a.default_mode), judge=judge, limits=limits,
                        judge_timeout_s=a.judge_timeout_s, default_timeout_s=a.default_timeout_s,
                        embedding_model=a.embedding_model, shutdown_grace_s=a.shutdown_grace_s).validate()


async def _score(a: argparse.Namespace, body: dict[str, Any]) -> int:
    from reward_server.client import RewardCallError, RewardClient
    from reward_server.errors import InvalidArgument
    from reward_server.http.convert import group_from_json

    if a.include_judgment:
        body.setdefault("options", {})["include_judgment"] = True
    try:
        req = group_from_json(body)
    except InvalidArgument as exc:
        print(json.dumps({"error": exc.info().to_json()}, indent=2), file=sys.stderr)
        return 2
    addresses = a.address or [os.environ.get("COMPEER_ADDRESS", "localhost:50051")]
    async with RewardClient(addresses, timeout_s=a.timeout_s) as client:
        try:
            resp = await client.score_group(req)
        except RewardCallError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(resp.to_json(), indent=2, ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    a = make_parser().parse_args(argv)
    if a.command == "score":
        with open(a.file, encoding="utf-8") as fh:
            body = json.load(fh)
        return asyncio.run(_score(a, body))
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(a)
    except ValueError as exc:
        print(f"compeer-reward serve: {exc}", file=sys.stderr)
        return 2
    from reward_server.server import serve

    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
