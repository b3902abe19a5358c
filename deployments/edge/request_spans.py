"""The Ingress's span of each request (``observability/tracing.py``): from the request's
arrival to its response's last byte, a stream's included, as an ASGI middleware, so a
request the guard refuses is traced as well as one a tier answers.

Only requests with a body (POST): the model routes. ``/health``, ``/metrics`` and
``/v1/models`` polls would bury them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from opentelemetry.trace import SpanKind
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.edge.placement import PLACEMENT_HEADER
from deployments.observability.tracing import (
    SERVE_REQUEST_ID,
    carrier_of,
    end_span,
    request_parent,
    serving,
    start_span,
    tracing_on,
)
from deployments.transport.serve_internals import serve_request_id


class RequestSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not tracing_on():
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "url.path": scope["path"],
            SERVE_REQUEST_ID: serve_request_id(),
        }
        span = start_span(
            f"POST {scope['path']}", request_parent(headers), SpanKind.SERVER, attributes
        )
        assert span is not None  # tracing is on

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
                answered = Headers(raw=message.get("headers", []))
                if PLACEMENT_HEADER.lower() in answered:
                    span.set_attribute("scaleout.text_placement", answered[PLACEMENT_HEADER])
            await send(message)

        error: BaseException | None = None
        try:
            with serving(carrier_of(span)):
                await self.app(scope, receive, send_traced)
        except BaseException as exc:
            error = exc
            raise
        finally:
            route = scope.get("route")
            if route is not None and getattr(route, "path", None):
                span.update_name(f"POST {route.path}")
                span.set_attribute("http.route", route.path)
            end_span(span, error)


def install_request_spans(app: FastAPI) -> None:
    """Outermost: installed after the guard, so its refusals are in the span."""
    app.add_middleware(RequestSpans)
