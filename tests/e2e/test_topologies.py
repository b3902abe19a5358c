"""Every topology in configs/ starts as a user's plain ``serve run configs/<X>.yaml``
and serves one request its way.

Each config runs as written but on a free port, a smaller KV cache and no
torch.compile (engines start 10-50 s sooner; the cluster suite runs the compiled
default), as the benchmark starts it (``bench.topology``): G tokens, T text,
B/BP per-chunk stateless derender (with and without parsers), S/I chat.
Topologies whose config files hold the same Serve config (T and I; B and S: they
differ in how clients use the graph, not in the graph) share one application,
and every check of theirs runs on it. All run side by side in one ``serve run``,
each file's application under its own route prefix (``/g``, ``/t``, ``/b``, ``/bp``)
and with fewer logical CPUs, so four fit this host: one Ray cluster and one start
for four graphs, each built from its file's args. That Ray cluster starts as a
user's does, without the graph's Serve switches (``serve run <config>`` cannot set
them): every graph serves, and its control plane says loudly what is missing. The
switches' own runs: the integration graph and ``test_serve_run_other_model.py``
(``serve run graph:build_app`` sets them), and the cluster suite (the KubeRay
manifests carry them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.servers import TINY_MODEL
from bench.topology import CONFIGS, Overrides, running_topologies
from deployments.config.serve_env import SERVE_ENV
from deployments.config.topologies import serve_config
from tests.support.leaving_clients import leave_once_running, wait_idle

MODEL = str(TINY_MODEL)
HI = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
ANSWER = "Hello! How can I help you today?"


def sse(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def render(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/chat/completions/render", json=body)
    assert response.status_code == 200, response.text
    rendered = response.json()
    rendered.pop("parse_context")
    return rendered


def tokens(client: httpx.Client) -> None:
    request = render(client, {**HI, "max_tokens": 16})
    reply = client.post("/inference/v1/generate", json=request)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["token_ids"]
    text = client.post("/inference/v1/generate", json={**request, "output_mode": "text"})
    assert text.status_code == 400  # tokens_only: the client detokenizes


def text(client: httpx.Client) -> None:
    request = render(client, {**HI, "max_tokens": 32})
    reply = client.post("/inference/v1/generate", json={**request, "output_mode": "text"})
    assert reply.status_code == 200, reply.text
    assert ANSWER in reply.json()["choices"][0]["text"]


THINK = {**HI, "messages": [{"role": "user", "content": "think: what is 2 plus 3?"}]}


def per_chunk_derender(parsed: bool) -> Callable[[httpx.Client], None]:
    """vLLM's stateless per-chunk /derender over a streamed generate: B runs the
    reasoning parser on the tier, BP runs none (the think block stays in content)."""

    def check(client: httpx.Client) -> None:
        request = render(client, {**THINK, "max_tokens": 60})
        chunks = sse(client.post("/inference/v1/generate", json={**request, "stream": True}).text)
        state, content, reasoning = None, "", ""
        for chunk in chunks:
            step = client.post(
                "/v1/chat/completions/derender",
                json={
                    "stream": True,
                    "generate_chunk": chunk,
                    "stream_state": state,
                    "chat_request": THINK,
                    "prompt_token_ids": request["token_ids"],
                },
            )
            assert step.status_code == 200, step.text
            state = step.json()["stream_state"]
            for choice in step.json()["chunk"]["choices"]:
                content += choice["delta"].get("content") or ""
                reasoning += choice["delta"].get("reasoning") or ""
        # vLLM 0.32's per-chunk derender keeps the end token's text (<|im_end|>)
        # in content when special tokens are kept for a parser.
        assert "The answer is 5." in content
        if parsed:
            assert "2 plus 3 is 5" in reasoning
            assert "think>" not in content and "2 plus 3" not in content
        else:
            assert reasoning == ""
            assert "</think>" in content and "2 plus 3 is 5" in content

    return check


def chat(placement: str) -> Callable[[httpx.Client], None]:
    def check(client: httpx.Client) -> None:
        reply = client.post("/v1/chat/completions", json={**HI, "stream": True})
        assert reply.status_code == 200, reply.text
        assert reply.headers["X-Text-Placement"] == placement
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in sse(reply.text))
        assert content.strip() == ANSWER

    return check


CHECKS: dict[str, Callable[[httpx.Client], None]] = {
    "G": tokens,
    "T": text,
    "B": per_chunk_derender(parsed=True),
    "BP": per_chunk_derender(parsed=False),
    "S": chat("tier"),
    "I": chat("inline"),
}


def same_graph_groups() -> list[list[str]]:
    """The topologies, grouped by identical Serve config (comments aside), in CHECKS order."""
    groups: dict[str, list[str]] = {}
    for name in CHECKS:
        key = json.dumps(serve_config(CONFIGS / f"{name}.yaml"), sort_keys=True)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


GROUPS = same_graph_groups()
EAGER_SMALL_CACHE = Overrides(kv_cache_gib=1, args={"enforce_eager": "true"})


def test_topologies_that_share_a_graph_have_equal_configs() -> None:
    """What lets T and I, and B and S, share a graph: their files hold one config."""
    assert sorted(map(sorted, GROUPS)) == [["B", "S"], ["BP"], ["G"], ["I", "T"]]


# deployments/config/serve_env.py: switches_warning
MISSING_SWITCHES = "runs the graph without its Serve switches"


def missing_switch_warnings(log: Path, app: str) -> list[str]:
    """The warning lines of ``app``'s replicas (Ray prefixes each ``ServeReplica:<app>:``)."""
    text = log.read_text(errors="replace")
    return [
        line
        for line in text.splitlines()
        if MISSING_SWITCHES in line and f"ServeReplica:{app}:" in line
    ]


# Four graphs on this 2-core host: their logical CPUs cut so all fit (Ray places by
# these; what runs is unchanged).
SHARED_CPUS = {
    "generate.num_cpus": "0.2",
    "render.num_cpus": "0.1",
    "derender.num_cpus": "0.1",
    "ingress.num_cpus": "0.05",
    # Unbound: four engines on two cores; bound, the first two would take a core each
    # and the others share the first (each its deployment's rank 0).
    "generate.cpu_cores": "off",
}
# Lets a test pace its own requests' engine steps (bench/harness/paced_decode.py);
# requests that do not ask are untouched.
PACED = {"logits_processors": ["bench.harness.paced_decode:PacedDecode"]}
SIDE_BY_SIDE_OVERRIDES = Overrides(
    kv_cache_gib=EAGER_SMALL_CACHE.kv_cache_gib,
    args={**EAGER_SMALL_CACHE.args, **SHARED_CPUS, **PACED},
)


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """Every topology group, each its own application of one plain ``serve run``."""
    work = tmp_path_factory.mktemp("topologies")
    names = [group[0] for group in GROUPS]
    with running_topologies(names, work, SIDE_BY_SIDE_OVERRIDES, serve_switches=False) as urls:
        yield urls, work / "topologies.serve.log"


@pytest.mark.parametrize("topologies", GROUPS, ids=["+".join(g) for g in GROUPS])
def test_topology_serves_without_the_serve_switches_and_says_what_it_lacks(
    topologies: list[str], side_by_side: tuple[dict[str, str], Path]
) -> None:
    urls, log = side_by_side
    with httpx.Client(base_url=urls[topologies[0]], timeout=120) as client:
        for topology in topologies:
            CHECKS[topology](client)
    # One warning from its control plane, naming every switch Ray started without.
    warnings = missing_switch_warnings(log, topologies[0].lower())
    assert len(warnings) == 1, warnings
    assert all(f"{name}={value} (here: None)" in warnings[0] for name, value in SERVE_ENV.items())


@pytest.mark.parametrize("topology", ["I", "S"])
def test_a_unary_request_whose_client_leaves_is_freed_behind_serves_own_proxy(
    topology: str, side_by_side: tuple[dict[str, str], Path]
) -> None:
    """Without the switches, Serve's Python proxy carries the requests (no HAProxy): it
    cancels a request whose client went away, and the Ingress's cancelled call frees
    the engine, inline (I) and on the tier (S). The integration suite checks the same
    behind HAProxy, on every route."""
    urls, _ = side_by_side
    (group,) = [g for g in GROUPS if topology in g]
    base = urls[group[0]]  # the application of the group's graph
    body = {
        **HI,
        "max_tokens": 1000,
        "ignore_eos": True,
        "vllm_xargs": {"pace_ms": 50},  # 50 s of decode, were it not freed
    }
    leave_once_running(base, "/v1/chat/completions", body, {}, clients=3, engine_requests=3)
    wait_idle(base, within_s=5.0)
