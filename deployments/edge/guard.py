"""The ingress's front door: API key, body size and body pace, before any route runs.

As middleware, it covers every ``/v1/*`` and ``/inference/*`` path, routes
added later included, so none can slip through unguarded. ``/health``,
``/metrics``, ``/tokenize`` and the tokens-only ``/abort_requests`` stay open,
as in vLLM.

Serve's proxy hands a request to the Ingress as soon as its headers are in,
and the body follows at the client's pace; each such request holds one of the
replica's ``max_ongoing_requests``. So the guard reads every body itself:
within ``body_timeout_s`` (else 408), and, for requests without the API key,
only so many slow ones at once (else 503): a body still coming after
``slow_body_s``. A thousand clients that never finish their bodies then hold a
few dozen slots, not all of them, and keyed traffic and ``/health`` keep being
served; a burst of clients whose bodies are all in, which a replica short of
CPU reads slowly, is served, not refused.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.edge.errors import CLIENT_CLOSED_REQUEST, to_http, unavailable
from deployments.messages.replies import error_reply
from deployments.observability.metrics import graph_metrics
from deployments.transport.serve_internals import replica_grpc_max_message_bytes

logger = logging.getLogger("ray.serve")
PROTECTED_PREFIXES = ("/v1/", "/inference/")


@dataclass(frozen=True)
class GuardSettings:
    api_key: str | None
    max_body_bytes: int
    body_timeout_s: float = 30.0
    """A body not fully sent within this long gets 408."""
    max_body_reads_without_key: int = 64
    """Slow bodies (still coming after ``slow_body_s``) read at once from requests without
    the key (all, if none is set); more: 503."""
    slow_body_s: float = 0.5
    """A body not in after this long is a slow one."""


# Methods whose requests carry no body worth reading (a GET's is ignored).
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS"})


def app_path(request: Request) -> str:
    """The path inside this app, without Serve's route prefix."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


def is_protected(path: str) -> bool:
    return path == "/v1" or path.startswith(PROTECTED_PREFIXES)


def key_matches(header: str | None, api_key: str) -> bool:
    scheme, _, token = (header or "").partition(" ")
    # Constant time, whatever the guess: no early exit on the first wrong byte.
    return hmac.compare_digest(f"{scheme.lower()} {token}".encode(), f"bearer {api_key}".encode())


class Guard:
    """Pure ASGI middleware, so streamed responses pass straight through.

    Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``) re-streams
    every body chunk through a memory channel and a task: one more hop per SSE
    event on every stream. This one only looks at the request, and reads its
    body, to count it and to time it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._slow_reads_without_key = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings: GuardSettings | None = None
        if scope["type"] == "http" and "app" in scope:
            settings = getattr(scope["app"].state, "guard", None)
        if settings is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = _refusal(request, settings)
        if refusal is None and request.method not in _BODILESS:
            body, refusal = await self._read(request, receive, settings)
            if body is not None:
                receive = _replay(body, receive)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    async def _read(
        self, request: Request, receive: Receive, settings: GuardSettings
    ) -> tuple[bytes | None, Response | None]:
        """The whole body (handed on whole), or the refusal of it."""
        keyed = settings.api_key is not None and key_matches(
            request.headers.get("authorization"), settings.api_key
        )
        read = _read_body(receive, settings.max_body_bytes)
        try:
            async with asyncio.timeout(settings.body_timeout_s):
                body = await (read if keyed else self._read_without_key(read, settings))
        except TimeoutError:
            return None, _body_timeout(settings)
        except ClientDisconnect:  # gone before its body was in: nothing to serve
            return None, Response(status_code=CLIENT_CLOSED_REQUEST)
        except _TooManySlowBodies:
            return None, _busy()
        if body is None:
            return None, _too_large(f"more than {settings.max_body_bytes}", settings)
        return body, None

    async def _read_without_key(
        self, read: Coroutine[Any, Any, bytes | None], settings: GuardSettings
    ) -> bytes | None:
        """A keyless body. Only one still coming after ``slow_body_s`` holds one of the
        few slow reads: a burst of clients whose bodies are in, which a replica short of
        CPU gets to late, is read, not refused. A timer, not a task per read: a body that
        is in costs one timer set and cancelled."""
        task = asyncio.current_task()
        assert task is not None
        slow = _SlowBody()
        grace = asyncio.get_running_loop().call_later(
            settings.slow_body_s, self._on_slow, task, slow, settings
        )
        try:
            return await read
        except asyncio.CancelledError:
            # Refused: the read is dropped with its request (a 503), so cutting it short
            # is safe. Another cancellation as well (the body deadline, shutdown) wins.
            if slow.refused and task.uncancel() == 0:
                raise _TooManySlowBodies from None
            raise
        finally:
            grace.cancel()
            if slow.counted:
                self._slow_reads_without_key -= 1

    def _on_slow(self, task: asyncio.Task[Any], slow: _SlowBody, settings: GuardSettings) -> None:
        """Its grace is over and the body is still coming: it takes a slow read, or is
        refused when they are all taken."""
        if self._slow_reads_without_key >= settings.max_body_reads_without_key:
            slow.refused = True
            task.cancel()
        else:
            self._slow_reads_without_key += 1
            slow.counted = True


@dataclass
class _SlowBody:
    counted: bool = False
    refused: bool = False


class _TooManySlowBodies(Exception):
    """Raised where a refused read is cut short; answered with 503."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it grows past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed out first; after it, the
    server's own (a disconnect must still reach a streaming response)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _busy() -> Response:
    return to_http(unavailable("too many requests are sending their bodies; retry later"))


def _body_timeout(settings: GuardSettings) -> Response:
    return to_http(
        error_reply(
            f"the request body was not sent within {settings.body_timeout_s:g} s",
            "RequestTimeout",
            HTTPStatus.REQUEST_TIMEOUT,
        ),
        {"Connection": "close"},
    )


def _too_large(size: str, settings: GuardSettings) -> Response:
    return to_http(
        error_reply(
            f"request body of {size} bytes exceeds {settings.max_body_bytes}",
            "RequestEntityTooLarge",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    )


# vLLM's AuthenticationMiddleware answers exactly this, not an ErrorResponse.
UNAUTHORIZED = {"error": "Unauthorized"}


def _refusal(request: Request, settings: GuardSettings) -> Response | None:
    """The answer to a request the guard stops by its headers, or None to let it through."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
        return _too_large(length, settings)
    api_key = settings.api_key
    # As vLLM: CORS preflights (OPTIONS) carry no key.
    needs_key = (
        api_key is not None and request.method != "OPTIONS" and is_protected(app_path(request))
    )
    if needs_key and not key_matches(request.headers.get("authorization"), api_key or ""):
        graph_metrics().refusals.inc(tags={"status": str(int(HTTPStatus.UNAUTHORIZED))})
        return JSONResponse(UNAUTHORIZED, status_code=HTTPStatus.UNAUTHORIZED)
    return None


def crossing_body_cap(max_body_bytes: int) -> int:
    """``max_body_bytes``, or less where Serve's gRPC data plane could not carry such a
    body between tiers (its pickled request can outgrow the JSON: half its limit)."""
    crossing = replica_grpc_max_message_bytes() // 2
    if crossing < max_body_bytes:
        logger.warning(
            "bodies capped at %d bytes, not max_body_bytes=%d: Serve's gRPC data plane "
            "carries at most %d (RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH)",
            crossing,
            max_body_bytes,
            2 * crossing,
        )
    return min(max_body_bytes, crossing)


def install_guard(app: FastAPI) -> None:
    app.add_middleware(Guard)
