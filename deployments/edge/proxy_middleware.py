"""Middleware in Serve's HTTP servers, ahead of Serve's own request-id handling.

Serve runs it when ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` names
``middlewares`` (``deployments/config/serve_env.py``: ``make run``, the tests and the
KubeRay pods set it): in its Python proxy, and behind HAProxy (the graph's default
edge) in each Ingress replica's own HTTP server. It mends two things a client meets
before the Ingress:

- **Unguessable request ids.** A request without ``X-Request-Id`` gets one
  from Serve's proxy, made with ``random.getrandbits`` (Mersenne Twister: a
  client that reads ~600 of its own ids can predict the next ones), and the
  Ingress names the request by it (``chatcmpl-<id>``), as vLLM names it by the
  header. Here such a request gets a ``uuid4``, as vLLM makes its ids.
- **Header values that are not UTF-8.** Serve's proxy decodes
  ``X-Request-Id``, session and model-id headers as UTF-8 and answers 500 when
  one is not; vLLM takes any bytes (Starlette reads headers as Latin-1). Such a
  value is passed on as the UTF-8 of its Latin-1 reading, so the request is
  served (with an id that reads differently from vLLM's for those bytes).
"""

from __future__ import annotations

import uuid

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"


def middlewares() -> list[Middleware]:
    """What Serve's proxy calls (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``)."""
    return [Middleware(ProxyEdge)]


class ProxyEdge:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["headers"] = mended_headers(scope["headers"])
        await self.app(scope, receive, send)


def mended_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Every value UTF-8, and an ``X-Request-Id`` (a uuid4 if the client sent none)."""
    out = []
    has_id = False
    for name, value in headers:
        has_id = has_id or name.lower() == REQUEST_ID_HEADER
        if not value.isascii():
            try:
                value.decode()
            except UnicodeDecodeError:
                value = value.decode("latin-1").encode()
        out.append((name, value))
    if not has_id:
        out.append((REQUEST_ID_HEADER, str(uuid.uuid4()).encode()))
    return out
