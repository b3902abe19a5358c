"""One real graph for the whole integration session.

``serve run`` of a Serve config with two applications on one Ray cluster:
the embedded default at ``/`` (two Derender replicas), a ``tokens_only``
graph at ``/tokens-only`` and a ``stream_interval: 3`` graph at ``/interval``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import TINY_MODEL, Server, running_graph

MODEL = str(TINY_MODEL)
GRAPH_ARGS = {
    "model": MODEL,
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "max_model_len": 4096,
    "kv_cache_gib": 1,
    # Two apps share this 2-core host; logical CPUs only steer scheduling.
    "ingress": {"num_cpus": 0.05},
    "generate": {"num_cpus": 0.3},
    "render": {"num_cpus": 0.1},
    "derender": {"num_replicas": 2, "num_cpus": 0.1},
}
TOKENS_ONLY_PREFIX = "/tokens-only"
INTERVAL_PREFIX = "/interval"


@pytest.fixture(scope="session")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    apps = {
        "default": ("/", GRAPH_ARGS),
        "tokens-only": (
            TOKENS_ONLY_PREFIX,
            {
                **GRAPH_ARGS,
                "tokens_only": True,
                "text_placement": "tier",
                "derender": {"num_replicas": 1, "num_cpus": 0.1},
            },
        ),
        # Several tokens per engine chunk (vLLM --stream-interval 3).
        "interval": (
            INTERVAL_PREFIX,
            {**GRAPH_ARGS, "stream_interval": 3, "derender": {"num_replicas": 1, "num_cpus": 0.1}},
        ),
    }
    with running_graph(tmp_path_factory.mktemp("graph"), apps) as server:
        yield server


@pytest.fixture
def client(graph: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=graph.base_url, timeout=120) as c:
        yield c
