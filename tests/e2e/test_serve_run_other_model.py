"""`serve run graph:build_app model=…`: a model named on the command line.

The model is a copy of the tiny model under another folder and served name:
nothing in the graph may be hard-wired to the embedded default. The graph and
its vLLM oracle run without torch.compile (both start 10-50 s sooner); the
compiled default runs in the cluster suite.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.servers import (
    SERVE_RUN_STOP_GRACE_S,
    TINY_MODEL,
    VENV_BIN,
    Server,
    free_port,
    graph_env,
    port_is_free,
    running,
)
from deployments.config.serve_env import SERVE_ENV
from tests.integration.test_parity_vllm import (
    LOGPROB_TOLERANCE,
    split_logprob_values,
    streamed,
    unary,
)
from tests.support.early_start import EarlyStart, collected_use


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tmp_path_factory.mktemp("model") / "some-other-model"
    shutil.copytree(TINY_MODEL, model)
    return model


# `serve run IMPORT_PATH key=value …` serves on Serve's default port.
SERVE_DEFAULT_PORT = 8000


@pytest.fixture(scope="module")
def other_model_server(
    tmp_path_factory: pytest.TempPathFactory,
    other_model: Path,
    vllm_early: EarlyStart[Server] | None,
) -> Iterator[Server]:
    """``serve run graph:build_app model=…`` as a user types it: no config file, and
    none of the graph's Serve switches exported (graph.py sets them before Ray starts).
    After ``vllm_early``, so the oracle starts beside it."""
    if not port_is_free(SERVE_DEFAULT_PORT):
        pytest.skip(f"port {SERVE_DEFAULT_PORT} (Serve's default) is taken on this host")
    args = {
        "model": str(other_model),
        "served_model_name": "other",
        "max_model_len": "1024",
        "kv_cache_gib": "1",
        "enforce_eager": "true",
    }
    argv = [str(VENV_BIN / "serve"), "run", "graph:build_app"]
    argv += [f"{key}={value}" for key, value in args.items()]
    with running(
        argv,
        port=SERVE_DEFAULT_PORT,
        log_path=tmp_path_factory.mktemp("other") / "serve.log",
        env=graph_env(switches=False),
        unset=tuple(SERVE_ENV),
        stop_grace_s=SERVE_RUN_STOP_GRACE_S,
    ) as server:
        yield server


def test_plain_serve_run_of_the_import_path_gets_the_serve_switches(
    other_model_server: Server,
) -> None:
    """Ray's processes started with the switches: the control plane saw every one of
    them (it warns of any missing), and the proxy ran the graph's middleware (without
    it, Serve's proxy answers a non-UTF-8 X-Request-Id with 500)."""
    headers = {"X-Request-Id": b"id-\xff"}
    body = {"model": "other", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = httpx.post(
        f"{other_model_server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert reply.status_code == 200, reply.text
    log = other_model_server.log_path.read_text(errors="replace")
    assert "Started Serve" in log  # the log is the graph's (the warning would be in it)
    assert "runs the graph without its Serve switches" not in log


def test_serves_the_named_model(other_model_server: Server) -> None:
    with httpx.Client(base_url=other_model_server.base_url, timeout=120) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["other"]
        body = {"model": "other", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        # No parsers configured here: the raw think block stays in content.
        assert (
            "Hello! How can I help you today?" in reply.json()["choices"][0]["message"]["content"]
        )
        assert reply.json()["model"] == "other"
        # A default config names the replica, never its process.
        assert reply.headers["X-Served-By"]
        assert "X-Served-By-Pid" not in reply.headers


def test_unknown_model_is_404(other_model_server: Server) -> None:
    body = {"model": str(TINY_MODEL), "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(f"{other_model_server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 404
    assert reply.json()["error"]["type"] == "NotFoundError"


def test_max_model_len_reaches_the_engine(other_model_server: Server) -> None:
    listing = httpx.get(f"{other_model_server.base_url}/v1/models", timeout=30).json()
    assert listing["data"][0]["max_model_len"] == 1024
    assert Path(listing["data"][0]["root"]).name == "some-other-model"


def _vllm_without_parsers(tmp_path_factory: pytest.TempPathFactory, other_model: Path) -> Any:
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(other_model), "--served-model-name", "other",
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
        "--enforce-eager",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return running(argv, port=port, log_path=log, env=env)


@pytest.fixture(scope="module")
def vllm_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, other_model: Path
) -> Iterator[EarlyStart[Server] | None]:
    """``vllm_without_parsers``, started beside the graph when a collected test uses it
    (``tests/support/early_start.py``)."""
    if not collected_use(request, "vllm_without_parsers"):
        yield None
        return
    early = EarlyStart(_vllm_without_parsers(tmp_path_factory, other_model))
    try:
        yield early
    finally:
        early.close()


@pytest.fixture(scope="module")
def vllm_without_parsers(vllm_early: EarlyStart[Server] | None) -> str:
    """vLLM's own server for the same model and flags as this graph: no parsers."""
    assert vllm_early is not None
    return vllm_early.get().base_url


@pytest.mark.parametrize("prompt", ["hi", "think: what is 2 plus 3?"])
def test_chat_without_parsers_equals_vllm(
    other_model_server: Server, vllm_without_parsers: str, prompt: str
) -> None:
    """Plain chat (no reasoning or tool parser: the stream derenderer's plain path),
    unary and streamed, inline and tier, equals vLLM's server with the same flags:
    content, finish reason, usage, logprobs."""
    body = {
        "model": "other",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 40,
        "logprobs": True,
        "top_logprobs": 2,
    }
    with httpx.Client(base_url=vllm_without_parsers, timeout=120) as reference:
        want = unary(reference, body, {}), streamed(reference, body, {})
    want_values = [split_logprob_values(w) for w in want]
    assert want[0]["message"]["content"], "vLLM answered no content: the case tests nothing"
    with httpx.Client(base_url=other_model_server.base_url, timeout=120) as client:
        for placement in ("inline", "tier"):
            headers = {"X-Text-Placement": placement}
            got = unary(client, body, headers), streamed(client, body, headers)
            got_values = [split_logprob_values(g) for g in got]
            assert got == want, placement
            for values, wanted in zip(got_values, want_values, strict=True):
                assert values == pytest.approx(wanted, abs=LOGPROB_TOLERANCE), placement
