"""Slow clients without the key cannot stall the API (a bounded slowloris, on 127.0.0.1 only).

1,050 connections each send the headers of a ``POST /tokenize`` (open, as in
vLLM) and one byte of a 64-byte body, then nothing. Serve's proxy hands each to
the Ingress at once; before the guard read bodies itself, they held every one
of its ``max_ongoing_requests`` and keyed requests queued behind them. Now only
``max_body_reads_without_key`` of them are read at a time, the rest get 503 at
once, and keyed requests and ``/health`` answer while the slow ones hang on.
"""

from __future__ import annotations

import contextlib
import socket
import time
from urllib.parse import urlsplit

import httpx

from tests.integration.conftest import AUTH, TOKENS_ONLY_PREFIX

SLOW_CLIENTS = 1050
# Well below the guard's 30 s body deadline: an answer here is not the slow
# clients timing out, it is keyed traffic served beside them.
PROBE_TIMEOUT_S = 10.0


def _open_slow(host: str, port: int, path: str) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 64\r\n\r\n{".encode()
    )
    return sock


def test_keyed_requests_and_health_answer_beside_slow_clients(client: httpx.Client) -> None:
    url = urlsplit(str(client.base_url))
    assert url.hostname in ("127.0.0.1", "localhost"), url  # a load test targets loopback only
    host, port = "127.0.0.1", url.port or 80
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW_CLIENTS):
            slow.append(_open_slow(host, port, f"{TOKENS_ONLY_PREFIX}/tokenize"))
        time.sleep(1.0)  # let the proxy hand them all to the Ingress
        with httpx.Client(base_url=str(client.base_url), timeout=PROBE_TIMEOUT_S) as probe:
            models = probe.get(f"{TOKENS_ONLY_PREFIX}/v1/models", headers=AUTH)
            health = probe.get(f"{TOKENS_ONLY_PREFIX}/health")
            tokenized = probe.post(
                f"{TOKENS_ONLY_PREFIX}/tokenize",
                json={"prompt": "hi"},
                headers=AUTH,
            )
        assert models.status_code == 200, models.text
        assert health.status_code == 200
        assert tokenized.status_code == 200, tokenized.text
        # The slow clients past the guard's cap were refused at once, not queued.
        refused = 0
        for sock in slow:
            sock.settimeout(0.05)
            with contextlib.suppress(OSError):
                refused += sock.recv(64).startswith(b"HTTP/1.1 503")
        assert refused > 0
    finally:
        for sock in slow:
            sock.close()
    assert client.get(f"{TOKENS_ONLY_PREFIX}/health").status_code == 200
