"""The proxy edge, inside Serve's own proxy middleware stack."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

from deployments.edge.proxy_middleware import mended_headers, middlewares
from deployments.transport.serve_internals import proxy_asgi_stack, proxy_request_id


def _through_proxy(headers: list[tuple[bytes, bytes]], edge: bool = True) -> dict[bytes, bytes]:
    """The headers the Ingress gets after Serve's proxy middlewares (ours outside Serve's)."""
    seen: dict[bytes, bytes] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(dict(scope["headers"]))

    async def run() -> None:
        stack = proxy_asgi_stack(app, middlewares() if edge else [])
        scope = {"type": "http", "headers": list(headers)}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(_: Any) -> None:
            return None

        await stack(scope, receive, send)

    asyncio.run(run())
    return seen


def test_a_request_without_an_id_gets_a_uuid4_not_serves_predictable_one() -> None:
    random.seed(1234)
    predicted = proxy_request_id()  # what Serve's proxy makes next from this state
    random.seed(1234)
    assert _through_proxy([], edge=False)[b"x-request-id"].decode() == predicted  # the oracle
    random.seed(1234)
    made = _through_proxy([])[b"x-request-id"].decode()
    assert made != predicted
    assert uuid.UUID(made).version == 4


def test_a_clients_id_is_kept() -> None:
    assert _through_proxy([(b"x-request-id", b"mine-1")])[b"x-request-id"] == b"mine-1"


def test_values_that_are_not_utf8_are_passed_on_as_utf8() -> None:
    seen = _through_proxy([(b"x-request-id", b"id-\xff\xfe"), (b"x-other", b"caf\xc3\xa9")])
    assert seen[b"x-request-id"].decode() == "id-\xff\xfe"  # the Latin-1 reading, as UTF-8
    assert seen[b"x-other"] == b"caf\xc3\xa9"  # already UTF-8: untouched


def test_ascii_headers_pass_unchanged() -> None:
    headers = [(b"host", b"x"), (b"x-request-id", b"abc")]
    assert mended_headers(headers) == headers
