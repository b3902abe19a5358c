"""Seeded sampling on the CPU engine: prompts longer than one step's token budget.

vLLM 0.32's CPU engine dies on a seeded request whose prompt is prefilled in
chunks ("CPU Generator does not use offset"); the graph's engines run
``deployments/vllm_adapter/cpu_worker.py``, which rewinds the generator for real. The CPU
engine's step budget is 2,048 tokens, so a ~3,000-token prompt takes two steps.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.integration.conftest import AUTH, MODEL, TOKENS_ONLY_PREFIX
from tests.integration.test_failure_semantics import running_requests

STEP_BUDGET = 2048  # vLLM's max_num_batched_tokens for the OpenAI server on CPU


def long_chat(words: int = 1000, **extra: Any) -> dict[str, Any]:
    """A chat whose prompt starts with a fresh nonce, so no cache holds any of it."""
    text = f"{uuid.uuid4().hex} " + " ".join(f"w{i % 97}" for i in range(words))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "temperature": 1.0,
        "seed": 7,
        "max_tokens": 16,
        **extra,
    }


def generate_tokens(client: httpx.Client, request: dict[str, Any]) -> list[int]:
    reply = client.post(f"{TOKENS_ONLY_PREFIX}/inference/v1/generate", json=request, headers=AUTH)
    assert reply.status_code == 200, reply.text
    return list(reply.json()["choices"][0]["token_ids"])


def test_a_chunked_seeded_prompt_gives_the_tokens_of_an_unchunked_one(
    client: httpx.Client,
) -> None:
    """First run: prefilled in two steps (one sampled token dropped and rewound).
    Second run: the prefix cache holds the prompt, so one step and nothing
    dropped. Equal tokens mean the dropped draw was rewound exactly; an engine
    that skipped the rewind would draw from another point of the seed's stream."""
    rendered = client.post(
        f"{TOKENS_ONLY_PREFIX}/v1/chat/completions/render", json=long_chat(), headers=AUTH
    )
    assert rendered.status_code == 200, rendered.text
    request = rendered.json()
    request.pop("parse_context")
    # The tiny model is sure of itself (it answers this with one token over and
    # over); among 400 tokens it never picks, at temperature 2, each draw of the
    # seed shows in the tokens.
    request["sampling_params"].update(temperature=2.0, allowed_token_ids=list(range(100, 500)))
    assert STEP_BUDGET < len(request["token_ids"]) < 4096 - 16, len(request["token_ids"])
    assert request["sampling_params"]["seed"] == 7

    chunked = generate_tokens(client, request)
    cached = generate_tokens(client, request)
    assert len(chunked) == 16
    assert cached == chunked
    # Another seed draws other tokens: the seed is what makes them repeat.
    other = {**request, "sampling_params": {**request["sampling_params"], "seed": 8}}
    assert generate_tokens(client, other) != chunked
    assert client.get(f"{TOKENS_ONLY_PREFIX}/health").status_code == 200


def test_concurrent_seeded_long_chats_in_every_placement(client: httpx.Client) -> None:
    """Seeded long prompts batched with each other on both Generate replicas."""

    def one(i: int) -> tuple[int, str]:
        placement = ("inline", "tier")[i % 2]
        reply = client.post(
            "/v1/chat/completions",
            json=long_chat(seed=i, stream=bool(i % 3)),
            headers={"X-Text-Placement": placement},
        )
        return reply.status_code, reply.text

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    assert [status for status, _ in results] == [200] * 6, results
    assert not [text for _, text in results if '"error"' in text], results  # none mid-stream
    counts = running_requests(client)
    assert len(counts) == 2 and client.get("/health").status_code == 200, counts
