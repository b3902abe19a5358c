"""Error values at the edge, and the one place they become HTTP.

Tiers answer the Ingress with ``Reply`` values (``messages/replies.py``), an
error among them in vLLM's body shape ``{"error": {"message", "type", "param",
"code"}}``; only the Ingress turns one into a response. At the edge, a route
(or a tier validating what the edge passed on) raises one as a ``Refusal``,
which the handler installed here answers. Nothing here imports vLLM: the
Ingress does not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from deployments.messages.replies import Reply, error_reply
from deployments.observability.metrics import graph_metrics

logger = logging.getLogger("ray.serve")
# nginx's status for a client that closed the connection first; nobody reads it.
CLIENT_CLOSED_REQUEST = 499


def bad_request(message: str, param: str | None = None) -> Reply:
    return error_reply(message, "BadRequestError", HTTPStatus.BAD_REQUEST, param)


def not_found(message: str) -> Reply:
    return error_reply(message, "NotFoundError", HTTPStatus.NOT_FOUND)


def unavailable(message: str) -> Reply:
    """503: the graph cannot serve this now; ``to_http`` adds ``Retry-After``."""
    return error_reply(message, "ServiceUnavailableError", HTTPStatus.SERVICE_UNAVAILABLE)


def internal_error(message: str = "internal server error") -> Reply:
    return error_reply(message, "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)


def no_live_replica(deployment: str) -> Reply:
    """503 while a tier a request needs has no running replica (one is being replaced)."""
    return unavailable(f"no {deployment} replica is running; one is starting, retry later")


class Refusal(Exception):
    """An error value raised at the edge; the Ingress's handler answers it (``to_http``),
    so a route reads straight through instead of checking each step's result."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.body["error"]["message"])
        self.reply = reply


def to_http(reply: Reply, headers: dict[str, str] | None = None) -> JSONResponse:
    """A reply (an answer or an error value) as the HTTP response."""
    if reply.status >= HTTPStatus.BAD_REQUEST:
        graph_metrics().refusals.inc(tags={"status": str(reply.status)})
    if reply.status == HTTPStatus.SERVICE_UNAVAILABLE:
        headers = {"Retry-After": "1", **(headers or {})}
    return JSONResponse(reply.body, status_code=reply.status, headers=headers)


def anthropic_error(body: dict[str, Any]) -> dict[str, Any]:
    """An error body in vLLM's OpenAI shape as vLLM's Messages routes translate it
    (``translate_error_response``): ``{"type": "error", "error": {type, message}}``."""
    error = body["error"]
    return {"type": "error", "error": {"type": error["type"], "message": error["message"]}}


# vLLM's request-validation handler types its 400s by the status phrase. It answers
# before a route runs, so vLLM's Messages routes never translate those.
VALIDATION_ERROR_TYPE = HTTPStatus.BAD_REQUEST.phrase


async def anthropic_shaped(answer: Awaitable[Response]) -> Response:
    """A Messages route's answer, its errors as vLLM's Messages routes answer them:
    in Anthropic's shape, but for a body that failed validation (or was not sent as
    JSON), which vLLM refuses in its OpenAI shape before the route runs."""
    try:
        response = await answer
    except Refusal as refused:
        response = to_http(refused.reply)
    if response.status_code < HTTPStatus.BAD_REQUEST or not isinstance(response, JSONResponse):
        return response
    body = json.loads(bytes(response.body))
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or error.get("type") == VALIDATION_ERROR_TYPE:
        return response
    headers = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
    return JSONResponse(anthropic_error(body), status_code=response.status_code, headers=headers)


def install_exception_handlers(app: FastAPI) -> None:
    """Whatever escapes a route still answers in vLLM's error shape, without a trace."""

    @app.exception_handler(Refusal)
    async def _refused(_: Request, exc: Refusal) -> Response:
        return to_http(exc.reply)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        status = HTTPStatus(exc.status_code)
        return to_http(error_reply(str(exc.detail), status.phrase, status))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> Response:
        # A client that left is routine, not an error: no traceback per disconnect.
        logger.debug("client left during %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # As vLLM's handlers: ValueError, TypeError, OverflowError (UnicodeError too)
        # are the input's fault, 400; the rest is ours. (vLLM's own client errors are
        # raised in the tiers, which answer them as values: ``edge/replies.py``.)
        if isinstance(exc, (ValueError, TypeError, OverflowError)):
            logger.info("%s %s: %s", request.method, request.url.path, exc)
            return to_http(bad_request(str(exc)))
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return to_http(internal_error())
