"""One trace per request across the tiers, read from a real OTLP collector, and one
request id across the tiers' log lines.

The default application sends every span to the collector in this process
(``conftest.trace_collector``), vLLM's engine spans included: the engines run with
``--otlp-traces-endpoint`` and each request's ``generate`` context. With
``observability.access_log: all`` (the default application's), Ray Serve's access log
line in each replica a request reaches carries its request id (the client's
``X-Request-Id``); each of our spans carries the same id. By default (the tokens-only
application) only the Ingress writes one.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from bench.harness.otlp_collector import Collector, Span
from bench.harness.servers import Server
from tests.integration.conftest import AUTH, MODEL, TOKENS_ONLY_PREFIX
from tests.integration.test_parity_vllm import SHAPES

CHAT = {**SHAPES["chat"], "max_tokens": 6}
INGRESS_CHAT = "POST /v1/chat/completions"


@pytest.fixture
def collector(graph: Server, trace_collector: Collector) -> Collector:
    if graph.process is None:
        pytest.skip("a graph started elsewhere (SCALEOUT_TEST_GRAPH_URL) sends no traces here")
    return trace_collector


def client_traceparent() -> tuple[str, str, dict[str, str]]:
    """A client's trace and span ids, and the W3C header that carries them (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def named(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [(s.name, s.parent_id) for s in spans])
    return found[0]


def has(*names: str) -> Callable[[list[Span]], bool]:
    return lambda spans: {s.name for s in spans} >= set(names)


def started_within(inner: Span, outer: Span) -> bool:
    """``inner`` began while ``outer`` ran (a tier's span may end a moment after its
    caller's: it cleans up after its answer has been sent)."""
    return outer.start_ns <= inner.start_ns <= outer.end_ns


def test_an_inline_stream_is_one_trace_under_the_clients_span(
    client: httpx.Client, collector: Collector
) -> None:
    trace_id, client_span, headers = client_traceparent()
    body = {**CHAT, "stream": True}
    with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={**headers, "X-Text-Placement": "inline"}
    ) as response:
        assert response.status_code == 200
        assert "[DONE]" in response.read().decode()
    expected = (INGRESS_CHAT, "render", "generate", "llm_request", "response")
    spans = collector.wait_for(trace_id, has(*expected))
    assert sorted(s.name for s in spans) == sorted(expected), spans
    ingress, render, generate, engine, answer = (named(spans, n) for n in expected)
    assert ingress.parent_id == client_span and ingress.kind == "SPAN_KIND_SERVER"
    assert ingress.attributes["http.response.status_code"] == 200
    assert ingress.attributes["scaleout.text_placement"] == "inline"
    assert ingress.attributes["http.route"] == "/v1/chat/completions"
    for child in (render, generate, answer):
        assert child.parent_id == ingress.span_id, child
        assert started_within(child, ingress), child
    assert engine.parent_id == generate.span_id
    assert render.end_ns <= generate.start_ns
    assert generate.attributes["scaleout.placement"] == "inline"
    # Each span made where its work runs: the tiers' replicas, and vLLM's engine.
    assert ingress.resource["scaleout.tier"] == "Ingress"
    assert render.resource["scaleout.tier"] == "Render"
    assert generate.resource["scaleout.tier"] == "Generate"
    assert engine.resource["vllm.instrumenting_module_name"] == "vllm.llm_engine"
    assert 1 <= engine.attributes["gen_ai.usage.completion_tokens"] <= CHAT["max_tokens"]


def test_a_tier_request_traces_derender_and_its_generate_call(
    client: httpx.Client, collector: Collector
) -> None:
    trace_id, client_span, headers = client_traceparent()
    response = client.post(
        "/v1/chat/completions", json=CHAT, headers={**headers, "X-Text-Placement": "tier"}
    )
    assert response.status_code == 200, response.text
    expected = (INGRESS_CHAT, "render", "derender", "generate", "llm_request")
    spans = collector.wait_for(trace_id, has(*expected))
    # A unary answer has no stream to send: no ``response`` span.
    assert sorted(s.name for s in spans) == sorted(expected), spans
    ingress, render, derender, generate, engine = (named(spans, n) for n in expected)
    assert ingress.parent_id == client_span
    assert ingress.attributes["scaleout.text_placement"] == "tier"
    assert render.parent_id == ingress.span_id
    assert derender.parent_id == ingress.span_id
    assert generate.parent_id == derender.span_id
    assert engine.parent_id == generate.span_id
    assert started_within(generate, derender) and started_within(derender, ingress)
    assert derender.resource["scaleout.tier"] == "Derender"
    assert derender.attributes["scaleout.placement"] == "tier"


def test_a_request_without_traceparent_starts_its_own_trace(
    client: httpx.Client, collector: Collector
) -> None:
    request_id = uuid.uuid4().hex
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
    response = client.post("/v1/completions", json=body, headers={"X-Request-Id": request_id})
    assert response.status_code == 200, response.text

    def ingress_of(spans: list[Span]) -> list[Span]:
        """The Ingress's spans of the request (every span of ours names its id)."""
        return [
            s
            for s in spans
            if s.kind == "SPAN_KIND_SERVER" and s.attributes.get("serve.request_id") == request_id
        ]

    roots = ingress_of(collector.wait_for(None, lambda spans: bool(ingress_of(spans))))
    assert len(roots) == 1 and roots[0].name == "POST /v1/completions", roots
    root = roots[0]
    assert root.parent_id is None
    spans = collector.wait_for(root.trace_id, has("render", "generate", "llm_request"))
    assert {s.name for s in spans} >= {"render", "generate", "llm_request"}, spans
    assert named(spans, "generate").attributes["scaleout.request_id"].startswith("cmpl-")


def test_a_refused_request_is_traced_with_its_status(
    client: httpx.Client, collector: Collector
) -> None:
    trace_id, client_span, headers = client_traceparent()
    response = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": -1}, headers=headers)
    assert response.status_code == 400
    spans = collector.wait_for(trace_id, has(INGRESS_CHAT, "render"))
    ingress = named(spans, INGRESS_CHAT)
    assert ingress.parent_id == client_span
    assert ingress.attributes["http.response.status_code"] == 400
    assert named(spans, "render").parent_id == ingress.span_id
    assert not {"generate", "derender", "llm_request"} & {s.name for s in spans}


def test_tokens_from_generate_are_traced_to_the_engine(
    client: httpx.Client, collector: Collector
) -> None:
    trace_id, _, headers = client_traceparent()
    body = {
        "model": MODEL,
        "token_ids": [1, 2, 3, 4],
        "sampling_params": {"max_tokens": 3, "temperature": 0},
    }
    response = client.post("/inference/v1/generate", json=body, headers=headers)
    assert response.status_code == 200, response.text
    expected = ("POST /inference/v1/generate", "generate", "llm_request")
    spans = collector.wait_for(trace_id, has(*expected))
    assert sorted(s.name for s in spans) == sorted(expected), spans
    ingress, generate, engine = (named(spans, n) for n in expected)
    assert generate.parent_id == ingress.span_id and engine.parent_id == generate.span_id


def log_lines(graph: Server, request_id: str, wanted: int, timeout_s: float = 30.0) -> list[str]:
    """The graph's log lines (``serve run``'s output: every replica's, through Ray's
    log monitor) naming ``request_id``, once ``wanted`` have come."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for line in graph.log_path.read_text().splitlines() if request_id in line]
        if len(lines) >= wanted or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def tiers_logging(graph: Server, app: str, request_id: str, wanted: int) -> set[str]:
    """The deployments of ``app`` whose access log lines name ``request_id``."""
    found = re.compile(re.escape(app) + r"_(\w+) \w+ " + re.escape(request_id))
    lines = log_lines(graph, request_id, wanted)
    return {m.group(1) for line in lines if (m := found.search(line))}


def test_one_request_id_ties_every_tiers_log_lines_and_spans(
    graph: Server, client: httpx.Client, collector: Collector
) -> None:
    request_id = uuid.uuid4().hex
    trace_id, _, headers = client_traceparent()
    headers |= {"X-Request-Id": request_id, "X-Text-Placement": "tier"}
    response = client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    # Serve's access log line of the request in each tier it crossed.
    tiers = tiers_logging(graph, "default", request_id, wanted=4)
    assert tiers == {"Ingress", "Render", "Derender", "Generate"}
    # The trace names it in every span the graph made (vLLM's engine span aside).
    spans = collector.wait_for(trace_id, has(INGRESS_CHAT, "render", "derender", "generate"))
    ours = [s for s in spans if s.name != "llm_request"]
    assert len(ours) == 4 and {s.attributes["serve.request_id"] for s in ours} == {request_id}
    # vLLM's own id for the request, named by the same header (as vLLM names it).
    for tier in ("derender", "generate"):
        assert request_id in named(spans, tier).attributes["scaleout.request_id"], tier


def test_by_default_only_the_ingress_logs_a_request(graph: Server, client: httpx.Client) -> None:
    # The tokens-only application runs with observability.access_log's default: a chat
    # crosses its Ingress, Render, Derender and Generate, and only the first writes.
    request_id = uuid.uuid4().hex
    headers = {**AUTH, "X-Request-Id": request_id}
    response = client.post(f"{TOKENS_ONLY_PREFIX}/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    assert tiers_logging(graph, "tokens-only", request_id, wanted=1) == {"Ingress"}
    # A tier's line, were it written, would reach serve run's output as the Ingress's
    # did, through Ray's log monitor, which reads every log file at least twice a
    # second: three seconds on, still the Ingress's alone.
    time.sleep(3)
    assert tiers_logging(graph, "tokens-only", request_id, wanted=1) == {"Ingress"}
