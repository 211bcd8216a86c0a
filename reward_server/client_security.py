"""What a client presents to a secured reward service: a bearer token and TLS settings (CA, client certificate).

The token comes from a file or an environment variable (``COMPEER_REWARD_TOKEN``), never from a command-line
value or a saved config: configs and command lines end up in logs, checkpoints and ``ps``. It travels as gRPC
metadata ``authorization: Bearer <token>`` on every call; without TLS it crosses the network in clear text, so use
TLS wherever the network is not trusted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "COMPEER_REWARD_TOKEN"


def read_token(path: str | None = None, env: str = TOKEN_ENV) -> str | None:
    """The token in file ``path`` (surrounding whitespace dropped), else in ``$env``, else None.

    Raises ValueError when the file holds no token (never printing its content).
    """
    if path:
        token = Path(path).read_text(encoding="utf-8").strip()
        if not token or any(c.isspace() for c in token):
            raise ValueError(f"token file {path}: expected exactly one token (no spaces)")
        return token
    value = os.environ.get(env, "").strip()
    return value or None


@dataclass(frozen=True, repr=False)
class ClientSecurity:
    """A client's credentials. ``tls`` is implied by any of the certificate paths; without ``ca_cert`` the
    system's roots verify the server. ``server_name`` overrides the name the server certificate must carry (for a
    connection by IP address, or a certificate issued for another name)."""

    token: str | None = None
    tls: bool = False
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None

    def __repr__(self) -> str:  # the token never appears in a repr, a log line or a traceback
        return (f"ClientSecurity(token={'<set>' if self.token else None}, tls={self.uses_tls}, ca_cert={self.ca_cert}"
                f", client_cert={self.client_cert}, server_name={self.server_name})")

    @classmethod
    def from_files(cls, *, token_file: str | None = None, token_env: str = TOKEN_ENV, tls: bool = False,
                   ca_cert: str | None = None, client_cert: str | None = None, client_key: str | None = None,
                   server_name: str | None = None) -> ClientSecurity:
        """Read the token (file, else env); ValueError for a client certificate without its key or the reverse."""
        if bool(client_cert) != bool(client_key):
            raise ValueError("a client certificate and its key go together: give both or neither")
        return cls(read_token(token_file, token_env), tls, ca_cert, client_cert, client_key, server_name)

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.ca_cert or self.client_cert)

    def channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        """An aio channel to ``address`` with these credentials."""
        opts = list(options)
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        interceptors = [_BearerToken(self.token)] if self.token else None
        if not self.uses_tls:
            return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca_cert).read_bytes() if self.ca_cert else None,
            private_key=Path(self.client_key).read_bytes() if self.client_key else None,
            certificate_chain=Path(self.client_cert).read_bytes() if self.client_cert else None)
        return grpc.aio.secure_channel(address, creds, options=opts, interceptors=interceptors)


class _BearerToken(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every unary call (the service's methods are all unary)."""

    def __init__(self, token: str) -> None:
        self._value = f"Bearer {token}"

    async def intercept_unary_unary(self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails,
                                    request: Any) -> Any:
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
        metadata.add("authorization", self._value)
        details = grpc.aio.ClientCallDetails(client_call_details.method, client_call_details.timeout, metadata,
                                             client_call_details.credentials, client_call_details.wait_for_ready)
        return await continuation(details, request)
