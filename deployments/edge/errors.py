"""Error values inside the graph, and the one place they become HTTP.

Deployments return vLLM's ``ErrorResponse`` as a value; only the ingress
turns it into a response, with vLLM's body shape
``{"error": {"message", "type", "param", "code"}}`` and the status in ``code``.
At the edge, a route raises one as a ``Refusal``, which the handler installed
here answers.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

logger = logging.getLogger("ray.serve")
# nginx's status for a client that closed the connection first; nobody reads it.
CLIENT_CLOSED_REQUEST = 499


def bad_request(message: str, param: str | None = None) -> ErrorResponse:
    return create_error_response(message, "BadRequestError", HTTPStatus.BAD_REQUEST, param)


def not_found(message: str) -> ErrorResponse:
    return create_error_response(message, "NotFoundError", HTTPStatus.NOT_FOUND)


def unavailable(message: str) -> ErrorResponse:
    """503: the graph cannot serve this now; ``to_http`` adds ``Retry-After``."""
    return create_error_response(message, "ServiceUnavailableError", HTTPStatus.SERVICE_UNAVAILABLE)


def no_live_replica(deployment: str) -> ErrorResponse:
    """503 while a tier a request needs has no running replica (one is being replaced)."""
    return unavailable(f"no {deployment} replica is running; one is starting, retry later")


class Refusal(Exception):
    """An error value raised at the edge; the Ingress's handler answers it (``to_http``),
    so a route reads straight through instead of checking each step's result."""

    def __init__(self, error: ErrorResponse) -> None:
        super().__init__(error.error.message)
        self.error = error


def to_http(error: ErrorResponse, headers: dict[str, str] | None = None) -> JSONResponse:
    if error.error.code == HTTPStatus.SERVICE_UNAVAILABLE:
        headers = {"Retry-After": "1", **(headers or {})}
    return JSONResponse(error.model_dump(), status_code=error.error.code, headers=headers)


def install_exception_handlers(app: FastAPI) -> None:
    """Whatever escapes a route still answers in vLLM's error shape, without a trace."""

    @app.exception_handler(Refusal)
    async def _refused(_: Request, exc: Refusal) -> Response:
        return to_http(exc.error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        status = HTTPStatus(exc.status_code)
        return to_http(create_error_response(str(exc.detail), status.phrase, status))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> Response:
        # A client that left is routine, not an error: no traceback per disconnect.
        logger.debug("client left during %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # As vLLM's handlers: ValueError, TypeError, OverflowError (UnicodeError too)
        # and vLLM's client errors are the input's fault, 4xx; the rest is ours.
        mapped = create_error_response(exc)
        if mapped.error.code < HTTPStatus.INTERNAL_SERVER_ERROR:
            logger.info("%s %s: %s", request.method, request.url.path, mapped.error.message)
            return to_http(mapped)
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return to_http(
            create_error_response(
                "internal server error", "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR
            )
        )
