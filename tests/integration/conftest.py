"""One real graph for the whole integration session.

``serve run`` of a Serve config with two applications on one Ray cluster
(four engines with vLLM's reference server fill this 24 GiB host):

- ``/``: the embedded default, two Generate and two Derender replicas, traced to a
  collector in the test process;
- ``/tokens-only``: ``tokens_only`` (text via the tier), an API key,
  ``stream_interval: 3`` and a one-deep Generate queue.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.otlp_collector import Collector, running_collector
from bench.harness.servers import (
    TINY_MODEL,
    Server,
    running_graph,
    running_vllm_as_graph,
    running_vllm_render,
)
from bench.metrics import running_requests
from deployments.routing.block_keys import kv_events_config
from tests.support.early_start import EarlyStart, collected_use

MODEL = str(TINY_MODEL)
GRAPH_ARGS = {
    "model": MODEL,
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "max_model_len": 4096,
    "kv_cache_gib": 1,
    # No torch.compile: each engine here (and the oracle, given the same flag)
    # starts 10-50 s sooner; outputs are compared engine to engine, never to
    # stored bytes. The compiled default runs in the e2e and cluster suites.
    "enforce_eager": True,
    # The tiny engine streams ~2,000 tokens/s per request; on 2 cores the one
    # HTTP proxy falls behind four such streams at the 10 ms default.
    "stream_coalesce_ms": 50,
    # Lets a test pace its own requests' decode steps (bench/harness/paced_decode.py).
    "logits_processors": ["bench.harness.paced_decode:PacedDecode"],
    # Two apps share this 2-core host; logical CPUs only steer scheduling.
    "ingress": {"num_cpus": 0.05},
    "generate": {"num_cpus": 0.3},
    "render": {"num_cpus": 0.1},
    "derender": {"num_replicas": 2, "num_cpus": 0.1},
    # Tests kill the replica that served them (X-Served-By-Pid); off in production.
    "expose_replica_pid": True,
}
TOKENS_ONLY_PREFIX = "/tokens-only"
API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="package")
def trace_collector() -> Iterator[Collector]:
    """The OTLP collector the default application sends its traces to (its engines'
    included), in this process for the whole session."""
    with running_collector() as collector:
        yield collector


@pytest.fixture(scope="package")
def graph(
    tmp_path_factory: pytest.TempPathFactory,
    oracles: dict[str, EarlyStart[Server]],
    trace_collector: Collector,
) -> Iterator[Server]:
    """The graph (after ``oracles``, so vLLM's servers start beside it)."""
    apps = {
        "default": (
            "/",
            {
                **GRAPH_ARGS,
                # Every request of the session traced, and Serve's access line of each
                # call in every tier (test_tracing reads both); the tokens-only
                # application runs untraced, with the Ingress's lines only, as the
                # default graph does.
                "observability": {
                    "otlp_traces_endpoint": trace_collector.endpoint,
                    "access_log": "all",
                },
                # A stream that moves while no Generate replica runs waits for the next
                # (test_generate_loss).
                "generate": {"num_replicas": 2, "num_cpus": 0.3, "migration_wait_s": 120},
            },
        ),
        "tokens-only": (
            TOKENS_ONLY_PREFIX,
            {
                **GRAPH_ARGS,
                "tokens_only": True,
                "text_placement": "tier",
                # Derender's requests to Generate on request channels (off by default).
                "request_channels": True,
                "api_key": API_KEY,
                # Several tokens per engine chunk (vLLM --stream-interval 3).
                "stream_interval": 3,
                # A Generate queue small enough to overload on purpose.
                "generate": {"num_cpus": 0.3, "max_ongoing_requests": 1, "max_queued_requests": 1},
                "derender": {"num_replicas": 1, "num_cpus": 0.1},
            },
        ),
    }
    external = os.environ.get("SCALEOUT_TEST_GRAPH_URL")
    if external:  # a graph a developer already runs with this same config
        yield Server(external, None, Path("/dev/null"))  # type: ignore[arg-type]
        return
    with running_graph(tmp_path_factory.mktemp("graph"), apps) as server:
        wait_settled(server.base_url, {"": 2, TOKENS_ONLY_PREFIX: 1})
        warm_up(server.base_url)
        yield server


@pytest.fixture(scope="package")
def vllm_kv_events(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where ``vllm_server`` publishes its KV cache events (ZMQ, this host only)."""
    return f"ipc://{tmp_path_factory.mktemp('kv-events') / 'vllm.ipc'}"


def _vllm_server(tmp_path_factory: pytest.TempPathFactory, kv_events: str) -> Any:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    extra = ["--enable-scale-out", "--kv-events-config", json.dumps(kv_events_config(kv_events))]
    return running_vllm_as_graph(log, GRAPH_ARGS, extra_args=extra)


def _vllm_render(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return running_vllm_render(tmp_path_factory.mktemp("vllm-render") / "render.log", GRAPH_ARGS)


@pytest.fixture(scope="package")
def oracles(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_kv_events: str,
) -> Iterator[dict[str, EarlyStart[Server]]]:
    """vLLM's own servers that this run's tests compare with, started beside the graph
    (``tests/support/early_start.py``)."""
    early: dict[str, EarlyStart[Server]] = {}
    try:
        if collected_use(request, "vllm_server"):
            early["vllm_server"] = EarlyStart(_vllm_server(tmp_path_factory, vllm_kv_events))
        if collected_use(request, "vllm_render"):
            early["vllm_render"] = EarlyStart(_vllm_render(tmp_path_factory))
        yield early
    finally:
        for server in early.values():
            server.close()


@pytest.fixture(scope="package")
def vllm_server(oracles: dict[str, EarlyStart[Server]]) -> Server:
    """The oracle: vLLM's own OpenAI server with the graph's model, parsers and
    context length. ``--enable-scale-out`` opens its ``/inference/v1/generate``,
    ``/render`` and ``/derender`` routes; it also publishes its KV cache events
    (``vllm_kv_events``; neither changes an output)."""
    return oracles["vllm_server"].get()


@pytest.fixture(scope="package")
def vllm_render(oracles: dict[str, EarlyStart[Server]]) -> Server:
    """The oracle for the Render and Derender tiers: ``vllm launch render``."""
    return oracles["vllm_render"].get()


def wait_settled(base_url: str, generate_replicas: dict[str, int], timeout_s: float = 300) -> None:
    """Until every app reports its Generate replica count, steadily.

    /health answers once one replica of each tier does; a second Generate
    replica (or one Serve replaced while the host was busy starting engines)
    may still be coming up, and tests that reach every replica need them all.
    """
    deadline = time.monotonic() + timeout_s
    steady = 0
    while steady < 3:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Generate replicas did not settle at {generate_replicas}")
        counts = {}
        for prefix in generate_replicas:
            text = httpx.get(f"{base_url}{prefix}/metrics", timeout=30).text
            counts[prefix] = len(running_requests(text))
        steady = steady + 1 if counts == generate_replicas else 0
        time.sleep(1)


def warm_up(base_url: str) -> None:
    """A few requests down every path before the first test.

    An engine's first steps and each tier's first calls are slow (seen: an
    abort answered in 1.2 s while the engines ran their first requests); the
    tests measure a graph in service, not its first seconds.
    """
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for prefix, headers, concurrency in (("", {}, 6), (TOKENS_ONLY_PREFIX, AUTH, 1)):

            def one(i: int, prefix: str = prefix, headers: dict[str, str] = headers) -> None:
                placement = {"X-Text-Placement": ("inline", "tier")[i % 2]} if not prefix else {}
                reply = client.post(
                    f"{prefix}/v1/chat/completions",
                    json={**chat, "stream": True},
                    headers={**headers, **placement},
                )
                reply.raise_for_status()

            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(one, range(max(concurrency, 2))))
            client.post(
                f"{prefix}/inference/v1/abort_requests",
                json={"request_ids": ["warm-up"]},
                headers=headers,
            ).raise_for_status()


@pytest.fixture
def client(graph: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=graph.base_url, timeout=120) as c:
        yield c
