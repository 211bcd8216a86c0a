"""TLS of both fronts, from :class:`reward_server.config.SecuritySettings`: gRPC over TLS (mutual TLS when a
client CA is given: a client certificate that CA signed is then required) and HTTPS through uvicorn.

HTTPS does not ask for client certificates: the kubelet's HTTPS probes present none, and the HTTP front relies on
bearer tokens (``reward_server.auth``). Certificates are read at start-up; a renewed certificate needs a restart
(a rolling one in Kubernetes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from reward_server.config import SecuritySettings


def server_credentials(settings: SecuritySettings) -> grpc.ServerCredentials | None:
    """gRPC server credentials, or None when TLS is off (no ``--tls-cert``)."""
    if not settings.tls_cert or not settings.tls_key:
        return None
    pair = (Path(settings.tls_key).read_bytes(), Path(settings.tls_cert).read_bytes())
    ca = Path(settings.tls_client_ca).read_bytes() if settings.tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def add_grpc_port(server: grpc.aio.Server, address: str, settings: SecuritySettings) -> int:
    """Listen on ``address`` with TLS when configured, else in plaintext; returns the bound port."""
    credentials = server_credentials(settings)
    if credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials)


def uvicorn_tls(settings: SecuritySettings) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments for HTTPS (empty when TLS is off)."""
    if not settings.tls_cert:
        return {}
    return {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
