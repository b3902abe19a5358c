"""The tracing door (``observability/tracing.py``), the unary tiers' spans
(``edge/replies.answers_ingress``) and the engine's trace context
(``vllm_adapter/engine_streams``), with spans sent to a real OTLP collector."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest

from bench.harness.otlp_collector import Collector, Span, running_collector, running_http_collector
from deployments.edge.replies import answers_ingress
from deployments.observability import tracing
from deployments.vllm_adapter.engine_streams import EngineCall, record_streams


@pytest.fixture
def collector() -> Iterator[Collector]:
    with running_collector() as collector:
        tracing.configure_tracing(collector.endpoint, "Test")
        try:
            yield collector
        finally:
            tracing.configure_tracing(None, "Test")


def sent(collector: Collector, count: int) -> list[Span]:
    tracing.flush_tracing()
    spans = collector.wait_for(None, lambda spans: len(spans) >= count, timeout_s=10)
    assert len(spans) == count, spans
    return spans


def test_off_makes_no_span_and_passes_no_context() -> None:
    tracing.configure_tracing(None, "Test")
    assert not tracing.tracing_on()
    assert tracing.start_span("x", None) is None
    with tracing.traced("x", None) as span, tracing.serving(tracing.carrier_of(span)):
        assert span is None
        assert tracing.request_carrier() is None and tracing.request_trace_kwargs() == {}


def test_a_span_under_a_carrier_is_its_child_in_its_trace(collector: Collector) -> None:
    with tracing.traced("parent", None) as parent:
        carrier = tracing.carrier_of(parent)
        assert carrier is not None and carrier["traceparent"].startswith("00-")
        with tracing.traced("child", carrier, attributes={"k": "v"}):
            pass
    child, root = sorted(sent(collector, 2), key=lambda s: s.name)
    assert root.parent_id is None and root.resource["scaleout.tier"] == "Test"
    assert child.trace_id == root.trace_id and child.parent_id == root.span_id
    assert child.attributes == {"k": "v"}


def test_the_clients_traceparent_is_the_first_spans_parent(collector: Collector) -> None:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{trace_id}-{span_id}-01"}
    tracing.end_span(tracing.start_span("with", tracing.request_parent(headers)))
    tracing.end_span(tracing.start_span("without", tracing.request_parent({})))
    spans = {s.name: s for s in sent(collector, 2)}
    assert (spans["with"].trace_id, spans["with"].parent_id) == (trace_id, span_id)
    assert spans["without"].parent_id is None and spans["without"].trace_id != trace_id


def test_an_error_marks_its_span(collector: Collector) -> None:
    with pytest.raises(ValueError), tracing.traced("failing", None):
        raise ValueError("bad")
    (span,) = sent(collector, 1)
    assert (span.name, span.status) == ("failing", "STATUS_CODE_ERROR")


class Render:
    @answers_ingress
    async def chat_text(self, body: bytes) -> dict[str, Any]:
        return {"body": body.decode(), "carrier": tracing.request_carrier()}


def test_a_unary_tier_call_with_a_trace_runs_in_a_span_named_for_its_tier(
    collector: Collector,
) -> None:
    with tracing.traced("ingress", None) as ingress:
        carrier = tracing.carrier_of(ingress)

    async def answer(**trace: Any) -> Any:
        return await Render().chat_text(b"hi", **trace)

    # The method never sees ``trace``; inside, its calls go on under the caller's span.
    assert asyncio.run(answer(trace=carrier)) == {"body": "hi", "carrier": carrier}
    assert asyncio.run(answer()) == {"body": "hi", "carrier": None}
    spans = {s.name: s for s in sent(collector, 2)}
    assert spans["render"].parent_id == spans["ingress"].span_id
    # Outside a Serve request, no Serve request id.
    assert spans["render"].attributes == {"scaleout.method": "chat_text", "serve.request_id": ""}


class Engine:
    def __init__(self) -> None:
        self.trace_headers: list[Any] = []

    def generate(self, prompt: str, **kwargs: Any) -> AsyncGenerator[str, None]:
        self.trace_headers.append(kwargs.get("trace_headers"))

        async def stream() -> AsyncGenerator[str, None]:
            yield prompt

        return stream()


def test_the_engine_gets_the_trace_context_of_the_call_that_opens_its_stream() -> None:
    engine = Engine()
    record_streams(engine)
    carrier = {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}

    async def run() -> None:
        traced, untraced = EngineCall(trace=carrier), EngineCall()
        with traced.opening():
            engine.generate("a")
        with untraced.opening():
            engine.generate("b")
        with traced.opening():  # vLLM's own headers, when it has them, win
            engine.generate("c", trace_headers={"traceparent": "given"})
        engine.generate("d")  # outside any call
        await traced.close()
        await untraced.close()

    asyncio.run(run())
    assert engine.trace_headers == [carrier, None, {"traceparent": "given"}, None]


def test_with_serves_tracing_on_the_first_span_is_a_child_of_serves(
    collector: Collector,
) -> None:
    """Ray Serve's tracing makes its replica span the current one around the handler;
    the Ingress's span then goes under it, not under the client's header."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    serve_span = SpanContext(
        int(secrets.token_hex(16), 16),
        int(secrets.token_hex(8), 16),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    client = {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}
    with trace.use_span(NonRecordingSpan(serve_span)):
        tracing.end_span(tracing.start_span("ingress", tracing.request_parent(client)))
    (span,) = sent(collector, 1)
    assert span.trace_id == f"{serve_span.trace_id:032x}"
    assert span.parent_id == f"{serve_span.span_id:016x}"


def test_spans_go_over_http_when_the_protocol_variable_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``, as vLLM's exporter reads it."""
    monkeypatch.setenv(tracing.PROTOCOL_VARIABLE, "http/protobuf")
    with running_http_collector() as collector:
        tracing.configure_tracing(collector.endpoint, "Test")
        try:
            tracing.end_span(tracing.start_span("over-http", None))
            (span,) = sent(collector, 1)
        finally:
            tracing.configure_tracing(None, "Test")
    assert span.name == "over-http"
    monkeypatch.setenv(tracing.PROTOCOL_VARIABLE, "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        tracing.span_exporter("http://127.0.0.1:1")
