"""``compeer-reward serve`` (run the service) and ``compeer-reward score FILE.json`` (a client call)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from judge.settings import add_arguments, from_namespace
from reward_server.config import ServerConfig


def make_parser() -> argparse.ArgumentParser:
    """``serve``'s flags are generated from :class:`ServerConfig` (each with its default and environment name)."""
    p = argparse.ArgumentParser(prog="compeer-reward", description="UnifiReward judge service (gRPC + HTTP).")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve the judge over gRPC and HTTP",
                       description="Serve the judge over gRPC and HTTP. Every flag has an environment variable "
                                   "(named in its help); a flag on the command line wins.",
                       allow_abbrev=False)  # `--auth-tokens X` must not pass for `--auth-tokens-file X`
    add_arguments(s, ServerConfig, title="server")

    c = sub.add_parser("score", help="score a group from a JSON file (the POST /v1/score body) and print the result")
    c.add_argument("file", help="JSON file: {history, reference, candidates, options}")
    c.add_argument("--address", action="append", default=None,
                   help="gRPC host:port (repeatable; default localhost:50051 or env COMPEER_ADDRESS)")
    c.add_argument("--timeout-s", type=float, default=300.0)
    c.add_argument("--include-judgment", action="store_true")
    c.add_argument("--token-file", help="file holding the bearer token (default: env COMPEER_REWARD_TOKEN when set)")
    c.add_argument("--tls", action="store_true", help="TLS with the system's roots (implied by --tls-ca/--tls-cert)")
    c.add_argument("--tls-ca", help="PEM CA that signed the server's certificate")
    c.add_argument("--tls-cert", help="PEM client certificate (mutual TLS); needs --tls-key")
    c.add_argument("--tls-key", help="PEM private key of --tls-cert")
    return p


def config_from_args(a: argparse.Namespace) -> ServerConfig:
    """The validated server configuration from ``serve``'s parsed flags (ValueError names what to change)."""
    config: ServerConfig = from_namespace(ServerConfig, a)
    return config.validate()


async def _score(a: argparse.Namespace, body: dict[str, Any]) -> int:
    from reward_server.client import ClientSecurity, RewardCallError, RewardClient
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
    try:
        security = ClientSecurity.from_files(token_file=a.token_file, tls=a.tls, ca_cert=a.tls_ca,
                                             client_cert=a.tls_cert, client_key=a.tls_key)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    async with RewardClient(addresses, timeout_s=a.timeout_s, security=security) as client:
        try:
            resp = await client.score_group(req)
        except RewardCallError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(resp.to_json(), indent=2, ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        parser = make_parser()
    except ValueError as exc:  # an environment variable that does not parse
        print(f"compeer-reward: {exc}", file=sys.stderr)
        return 2
    a = parser.parse_args(argv)
    if a.command == "score":
        with open(a.file, encoding="utf-8") as fh:
            body = json.load(fh)
        return asyncio.run(_score(a, body))
    try:
        config = config_from_args(a)
    except ValueError as exc:
        print(f"compeer-reward serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from reward_server.server import serve

    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
