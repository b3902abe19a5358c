"""One real graph for the whole integration session.

``serve run`` of a Serve config with two applications on one Ray cluster:
the embedded default at ``/`` and a ``tokens_only`` graph at ``/tokens-only``.
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
    "generate": {"num_cpus": 0.5},
    "render": {"num_cpus": 0.1},
}
TOKENS_ONLY_PREFIX = "/tokens-only"


@pytest.fixture(scope="session")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    apps = {
        "default": ("/", GRAPH_ARGS),
        "tokens-only": (TOKENS_ONLY_PREFIX, {**GRAPH_ARGS, "tokens_only": True}),
    }
    with running_graph(tmp_path_factory.mktemp("graph"), apps) as server:
        yield server


@pytest.fixture
def client(graph: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=graph.base_url, timeout=120) as c:
        yield c
