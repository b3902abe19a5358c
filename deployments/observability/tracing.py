"""Traces across tiers: one OpenTelemetry trace per request, exported over OTLP.

Off unless ``GraphConfig.observability.otlp_traces_endpoint`` names a collector (as
vLLM's ``--otlp-traces-endpoint``); off, each call here is one check of a global.

The spans, each made in the replica where the work runs:

- ``POST <route>`` (the Ingress, kind SERVER): the whole request, to its response's
  last byte; its parent is the client's W3C ``traceparent`` when it sent one.
- ``render`` (Render), ``generate`` (Generate: its engine stream), ``derender``
  (Derender: the tier's stream): children of the Ingress's span, or ``generate`` of
  ``derender`` when the tier calls it.
- ``llm_request``: vLLM's own engine span (its output processor's), a child of
  ``generate``: the engine is given the same endpoint and ``generate``'s context.
- ``response`` (the Ingress): a stream from its first item to its last, as the
  client is sent it.

A tier is called with its parent's context as a W3C carrier (``Carrier``), passed with
the request's typed message, not Ray Serve's own trace context: this graph
multiplexes streams over one handle call per replica pair (``step_channel``), where a
per-call context names no request. When Ray Serve's tracing is on too
(``TracingConfig``), the Ingress's span is a child of Serve's (the current span).

Spans leave through a ``BatchSpanProcessor`` (a background thread; the
``OTEL_BSP_*`` variables set its delay and queue), by gRPC, or HTTP when
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``, as vLLM's exporter chooses.
Sampling is the SDK's (``OTEL_TRACES_SAMPLER``; by default every root, and each
child as its parent).
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

T = TypeVar("T")
Carrier = dict[str, str]
"""A span's context as W3C trace-context headers (``traceparent``, ``tracestate``)."""

SERVICE_NAME = "scaleout-serve"
PROTOCOL_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_endpoint: str | None = None


def span_exporter(endpoint: str) -> SpanExporter:
    """OTLP to ``endpoint``, by the protocol vLLM's exporter would use (gRPC unless
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` says ``http/protobuf``)."""
    protocol = os.environ.get(PROTOCOL_VARIABLE, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        return HttpSpanExporter(endpoint=endpoint)
    raise ValueError(f"{PROTOCOL_VARIABLE}={protocol!r}: use grpc or http/protobuf")


def configure_tracing(endpoint: str | None, tier: str) -> None:
    """This process's spans go to ``endpoint`` (None: no span is made). Its own
    ``TracerProvider``, not the global one: vLLM's engine and Ray Serve's tracing each
    set that for themselves in the processes they run in."""
    global _tracer, _provider, _endpoint
    if endpoint == _endpoint:
        return
    if _provider is not None:
        _provider.shutdown()
    _tracer, _provider, _endpoint = None, None, endpoint
    if endpoint is None:
        return
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": SERVICE_NAME, "scaleout.tier": tier, "process.pid": os.getpid()}
        )
    )
    provider.add_span_processor(BatchSpanProcessor(span_exporter(endpoint)))
    atexit.register(provider.shutdown)
    _tracer, _provider = provider.get_tracer(__name__), provider


def flush_tracing() -> None:
    """Send the spans this process has not sent yet (they leave in batches)."""
    if _provider is not None:
        _provider.force_flush()


def tracing_on() -> bool:
    return _tracer is not None


SERVE_REQUEST_ID = "serve.request_id"
"""The attribute with the request id Ray Serve's access log lines carry in every replica
the request reaches (the client's ``X-Request-Id``, else one Serve made): it ties a
trace to the request's log lines in every tier."""


def span_attributes(
    request_id: str, serve_request_id: Callable[[], str], **more: str
) -> dict[str, str]:
    """A tier span's attributes for one request: vLLM's id for it (``chatcmpl-…``), and
    Serve's (``SERVE_REQUEST_ID``, read only when tracing is on); none when off."""
    if _tracer is None:
        return {}
    attributes = {"scaleout.request_id": request_id, SERVE_REQUEST_ID: serve_request_id()}
    return attributes | {f"scaleout.{k}": v for k, v in more.items()}


def carrier_of(span: Span | None) -> Carrier | None:
    """``span``'s context for a call into another tier (None: no span, none to pass)."""
    if span is None:
        return None
    carrier: Carrier = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


Parent = Mapping[str, str] | Context | None
"""A carrier from the calling tier, a context, or None: the current one (a root
unless Ray Serve's tracing made a span current)."""


def start_span(
    name: str,
    parent: Parent,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Span | None:
    """A span begun now under ``parent``, or None when tracing is off. The caller ends
    it (``end_span``)."""
    if _tracer is None:
        return None
    context = (
        parent if isinstance(parent, Context) or parent is None else _PROPAGATOR.extract(parent)
    )
    return _tracer.start_span(name, context=context, kind=kind, attributes=dict(attributes or {}))


def end_span(span: Span | None, error: BaseException | None = None) -> None:
    if span is None:
        return
    if error is not None and isinstance(error, Exception):
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end()


@contextlib.contextmanager
def traced(
    name: str,
    parent: Parent,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span | None]:
    """A span around a block (it may hold ``yield``: the span is never made the
    task's current one, so no context is attached across a suspension)."""
    span = start_span(name, parent, kind, attributes)
    try:
        yield span
    except BaseException as exc:
        end_span(span, exc)
        raise
    else:
        end_span(span)


def traced_stream(
    name: str,
    parent: Parent,
    attributes: Mapping[str, Any],
    items: Callable[[Carrier | None], AsyncGenerator[T, None]],
) -> AsyncGenerator[T, None]:
    """``items(carrier)`` in a span under ``parent``, ``carrier`` its context; off,
    ``items(None)`` itself: no generator between, as a stream pays per item."""
    if _tracer is None:
        return items(None)
    return _spanned(name, parent, attributes, items)


async def _spanned(
    name: str,
    parent: Parent,
    attributes: Mapping[str, Any],
    items: Callable[[Carrier | None], AsyncGenerator[T, None]],
) -> AsyncGenerator[T, None]:
    with traced(name, parent, attributes=attributes) as span:
        async with contextlib.aclosing(items(carrier_of(span))) as inner:
            async for item in inner:
                yield item


def request_parent(headers: Mapping[str, str]) -> Parent:
    """The parent of a request's first span: Ray Serve's span when Serve's tracing is
    on (the current one), else the client's ``traceparent``, else none (a root)."""
    if trace.get_current_span().get_span_context().is_valid:
        return None
    return _PROPAGATOR.extract(headers)


# The context this task's request calls other tiers under (``serving``).
_REQUEST: ContextVar[Carrier | None] = ContextVar("scaleout_request_trace", default=None)


@contextlib.contextmanager
def serving(carrier: Carrier | None) -> Iterator[None]:
    """The block serves a request whose calls into other tiers run under ``carrier``:
    on the Ingress its own span's, on a tier its caller's (``request_carrier``)."""
    token = _REQUEST.set(carrier)
    try:
        yield
    finally:
        _REQUEST.reset(token)


def request_carrier() -> Carrier | None:
    """The context this task's request calls other tiers under (None: not traced)."""
    return _REQUEST.get()


def trace_kwargs(carrier: Carrier | None) -> dict[str, Any]:
    """A tier call's ``trace`` keyword for ``carrier``; none when not traced, so an
    untraced graph's calls are what they were."""
    return {} if carrier is None else {"trace": carrier}


def request_trace_kwargs() -> dict[str, Any]:
    """``trace_kwargs`` of this task's request (``request_carrier``)."""
    return trace_kwargs(_REQUEST.get())
