"""An OTLP trace collector: the gRPC ``TraceService`` every OpenTelemetry exporter
sends to (opentelemetry-proto's own service definition), on a free loopback port. It
keeps each span it is sent, as plain values. In the tests' process, or its own
(``python -m bench.harness.otlp_collector``, for a benchmark's traced graph)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.endpoint = ""
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self.exports = 0

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Span(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            name=span.name,
                            kind=SpanProto.SpanKind.Name(span.kind),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            status=Status.StatusCode.Name(span.status.code),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            resource=resource,
                        )
                    )
        with self._lock:
            self._spans.extend(received)
            self.exports += 1
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self, trace_id: str | None = None) -> list[Span]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait_for(
        self, trace_id: str | None, done: Callable[[list[Span]], bool], timeout_s: float = 60.0
    ) -> list[Span]:
        """The trace's spans (None: every span) once ``done`` holds for them (exporters
        batch: a span leaves up to 5 s after it ends); what came, if it never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans(trace_id)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.5)


@contextlib.contextmanager
def running_collector() -> Iterator[Collector]:
    collector = Collector()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    collector.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield collector
    finally:
        server.stop(grace=None)


@contextlib.contextmanager
def running_http_collector() -> Iterator[Collector]:
    """The same over OTLP/HTTP (protobuf bodies POSTed to ``/v1/traces``); its
    ``endpoint`` is the full URL, as an HTTP exporter is given it."""
    collector = Collector()

    class Traces(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            answer = collector.Export(request, None).SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Traces)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    collector.endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    """A collector in its own process, for a benchmark's traced graph: prints its
    endpoint, serves until SIGTERM, then prints how many spans it was sent."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with running_collector() as collector:
        print(collector.endpoint, flush=True)
        stop.wait()
        print(len(collector.spans()), flush=True)


if __name__ == "__main__":
    main()
