"""The Ingress replica never loads vLLM, whatever its routes answer.

The Ingress passes bodies on to the tier that owns their vLLM model and reads
only plain replies back (``messages/replies.py``). A vLLM object reaching it
(a reply, an error value, an exception a tier raised) would import vLLM, and
torch under it, when Ray unpickles it: ~5 s of a blocked event loop and ~0.5
GB per replica. Checked on the running replicas' memory maps, after every
kind of answer, error and stream (and whatever the suite sent before).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench.engine_death import replica_processes
from tests.integration.conftest import AUTH, TOKENS_ONLY_PREFIX
from tests.integration.test_parity_vllm import SHAPES
from tests.integration.test_skeleton import rendered

CHAT = {**SHAPES["chat"], "max_tokens": 4}
COMPLETION = {"model": CHAT["model"], "prompt": "hi", "max_tokens": 4}


def every_kind_of_answer(client: httpx.Client) -> list[int]:
    """One request of each kind the Ingress routes; their statuses."""
    tokens = rendered(client, CHAT)
    generate = {k: tokens[k] for k in ("token_ids", "sampling_params", "model")}
    sent = [
        client.get("/v1/models"),
        client.get("/version"),
        client.get("/metrics"),
        client.post("/tokenize", json={"model": CHAT["model"], "prompt": "hi"}),
        client.post("/detokenize", json={"model": CHAT["model"], "tokens": [1, 2]}),
        client.post("/v1/completions/render", json=COMPLETION),
        client.post("/v1/chat/completions", json=CHAT, headers={"X-Text-Placement": "inline"}),
        client.post("/v1/chat/completions", json=CHAT, headers={"X-Text-Placement": "tier"}),
        client.post("/v1/chat/completions", json={**CHAT, "stream": True}),
        client.post("/v1/completions", json=COMPLETION, headers={"X-Text-Placement": "tier"}),
        client.post("/inference/v1/generate", json=generate),
        client.post("/inference/v1/generate", json={**generate, "stream": True}),
        client.post("/inference/v1/generate", json={**generate, "output_mode": "text"}),
        client.post(
            "/inference/v1/generate",
            json={**generate, "output_mode": "derender", "parse_context": tokens["parse_context"]},
        ),
        # Error values from each tier: Render, Generate, Derender (its two routes).
        client.post("/v1/chat/completions", json={"model": CHAT["model"], "messages": 3}),
        client.post("/inference/v1/generate", json={**generate, "token_ids": "x"}),
        client.post(
            "/inference/v1/generate",
            json={
                **generate,
                "output_mode": "derender",
                "sampling_params": {**generate["sampling_params"], "detokenize": False},
            },
        ),
        client.post("/v1/chat/completions/derender", json={"model": CHAT["model"]}),
        client.post("/tokenize", content=b"[" * 2000, headers={"Content-Type": "application/json"}),
    ]
    return [response.status_code for response in sent]


def loaded_libraries(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1] for line in maps.splitlines() if line.split()[-1].startswith("/")}


def test_the_ingress_replicas_load_no_vllm_and_no_torch(client: httpx.Client) -> None:
    statuses = every_kind_of_answer(client)
    assert statuses[:14] == [200] * 14, statuses
    assert all(400 <= s < 500 for s in statuses[14:]), statuses
    tokens_only = client.post(
        f"{TOKENS_ONLY_PREFIX}/v1/chat/completions", json=CHAT, headers=AUTH
    ).status_code
    assert tokens_only == 200

    ingresses = [
        *replica_processes("default", "Ingress"),
        *replica_processes("tokens-only", "Ingress"),
    ]
    if not ingresses:
        pytest.skip("the graph runs elsewhere (SCALEOUT_TEST_GRAPH_URL): no replica to read")
    assert len(ingresses) == 2
    for process in ingresses:
        libraries = loaded_libraries(process.pid)
        assert any("/ray/" in path for path in libraries)  # the maps are read, Ray is in
        assert not [p for p in libraries if "/torch/" in p or "/vllm/" in p], process.pid
