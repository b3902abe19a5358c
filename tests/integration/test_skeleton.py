"""Render → generate → ingress on a real graph and a real vLLM engine, over HTTP."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from bench.harness.servers import Server
from scripts.build_tiny_model import TIME_TOOL, WEATHER_TOOL
from tests.integration.conftest import AUTH, MODEL, TOKENS_ONLY_PREFIX

HI = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def sse_payloads(body: str) -> list[Any]:
    """``data:`` payloads of an SSE body, ``[DONE]`` kept as the string.

    Split on SSE's line ends only: ``str.splitlines`` would also split JSON text
    holding U+2028 and kin."""
    out: list[Any] = []
    for line in re.split(r"\r\n|\r|\n", body):
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def rendered(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/chat/completions/render", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_health_and_models(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


RENDER_CHATS = {
    "plain": {**HI, "max_tokens": 7, "temperature": 0},
    "defaults": HI,  # vLLM fills max_tokens from the context left
    "tools": {
        **HI,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": "auto",
    },
    "no-thinking": {**HI, "chat_template_kwargs": {"enable_thinking": False}, "seed": 3},
    "stop": {**HI, "stop": ["Rome"], "logprobs": True, "top_logprobs": 2},
}
RENDER_COMPLETIONS = {
    "prompt": {"model": MODEL, "prompt": "The capital of", "max_tokens": 5},
    "token-ids": {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0.5},
    "two-prompts": {"model": MODEL, "prompt": ["a", "b c"], "max_tokens": 5},
}


@pytest.mark.parametrize("name", list(RENDER_CHATS))
def test_chat_render_equals_vllm_launch_render(
    vllm_render: Server, client: httpx.Client, name: str
) -> None:
    """Our /v1/chat/completions/render answers what ``vllm launch render`` answers,
    plus vLLM 0.33's ``parse_context`` (which 0.32 does not have)."""
    body = {**RENDER_CHATS[name], "request_id": f"render-{name}"}
    want = httpx.post(f"{vllm_render.base_url}/v1/chat/completions/render", json=body, timeout=60)
    assert want.status_code == 200, want.text
    ours = rendered(client, body)
    context = ours.pop("parse_context")
    assert context["include_reasoning"] is True
    assert context["tools"] == body.get("tools")
    assert ours == want.json()


@pytest.mark.parametrize("name", list(RENDER_COMPLETIONS))
def test_completion_render_equals_vllm_launch_render(
    vllm_render: Server, client: httpx.Client, name: str
) -> None:
    body = {**RENDER_COMPLETIONS[name], "request_id": f"render-{name}"}
    want = httpx.post(f"{vllm_render.base_url}/v1/completions/render", json=body, timeout=60)
    assert want.status_code == 200, want.text
    ours = client.post("/v1/completions/render", json=body)
    assert ours.status_code == 200, ours.text
    assert ours.json() == want.json()
    assert len(ours.json()) == (2 if name == "two-prompts" else 1)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions/render", {"model": MODEL, "messages": []}),
        ("/v1/chat/completions/render", {**HI, "max_tokens": 10**6}),
        ("/v1/completions/render", {"model": MODEL, "prompt": "x", "max_tokens": -1}),
        ("/v1/completions/render", {"model": "nope", "prompt": "x"}),
    ],
    ids=["no-messages", "too-long", "negative-max-tokens", "unknown-model"],
)
def test_render_errors_equal_vllm_launch_render(
    vllm_render: Server, client: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    want = httpx.post(f"{vllm_render.base_url}{path}", json=body, timeout=60)
    got = client.post(path, json=body)
    assert want.status_code >= 400, want.text
    assert got.status_code == want.status_code, (got.text, want.text)
    got_error, want_error = got.json()["error"], want.json()["error"]
    assert (got_error["type"], got_error["code"]) == (want_error["type"], want_error["code"])


def test_tokens_mode_returns_token_ids(client: httpx.Client) -> None:
    request = rendered(client, {**HI, "max_tokens": 12, "temperature": 0})
    response = client.post("/inference/v1/generate", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["output_mode"] == "tokens"
    assert len(body["choices"][0]["token_ids"]) > 0
    assert "text" not in body["choices"][0]


def test_max_tokens_16_survives_render_to_generate(client: httpx.Client) -> None:
    """16 is SamplingParams' default, which vLLM leaves out of the rendered JSON;
    generate would read that as "unset" and run to the context length."""
    chat = rendered(client, {**HI, "max_tokens": 16, "ignore_eos": True})
    completion = client.post(
        "/v1/completions/render",
        json={"model": MODEL, "prompt": "The capital of", "max_tokens": 16, "ignore_eos": True},
    ).json()[0]
    for request in (chat, completion):
        request.pop("parse_context", None)
        response = client.post("/inference/v1/generate", json=request)
        assert response.status_code == 200, response.text
        assert len(response.json()["choices"][0]["token_ids"]) == 16


def test_text_mode_text_equals_detokenized_token_ids(client: httpx.Client) -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    for prompt in ("hi", "What is the capital of Japan?", "think: what is 2 plus 3?"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
        request = rendered(client, {**body, "max_tokens": 40, "temperature": 0})
        request["output_mode"] = "text"
        response = client.post("/inference/v1/generate", json=request)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["text"], choice
        assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


def test_text_mode_400_when_detokenize_false(client: httpx.Client) -> None:
    request = rendered(client, {**HI, "max_tokens": 4})
    request["output_mode"] = "text"
    request["sampling_params"]["detokenize"] = False
    response = client.post("/inference/v1/generate", json=request)
    assert response.status_code == 400
    assert "detokenize" in response.json()["error"]["message"]


def test_text_mode_400_on_tokens_only_graph(client: httpx.Client) -> None:
    request = rendered(client, {**HI, "max_tokens": 4})
    request.pop("parse_context")
    url = f"{TOKENS_ONLY_PREFIX}/inference/v1/generate"
    tokens = client.post(url, json=request, headers=AUTH)
    assert tokens.status_code == 200, tokens.text
    request["output_mode"] = "text"
    response = client.post(url, json=request, headers=AUTH)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and "tokenizer" in error["message"]


@pytest.mark.parametrize("output_mode", ["tokens", "text"])
def test_stream_and_unary_agree_under_greedy(client: httpx.Client, output_mode: str) -> None:
    request = rendered(client, {**HI, "max_tokens": 24, "temperature": 0})
    request["output_mode"] = output_mode
    unary = client.post("/inference/v1/generate", json={**request, "stream": False}).json()
    streamed = client.post("/inference/v1/generate", json={**request, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(streamed.text)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    token_ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert token_ids == unary["choices"][0]["token_ids"]
    assert chunks[-1]["choices"][0]["finish_reason"] == unary["choices"][0]["finish_reason"]
    if output_mode == "text":
        text = "".join(c["choices"][0]["text"] for c in chunks)
        assert text == unary["choices"][0]["text"]


def test_chat_completion_plain_answer(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={**HI, "temperature": 0})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["content"].strip() == "Hello! How can I help you today?"


def test_chat_completion_stream_ends_with_done(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={**HI, "temperature": 0, "stream": True})
    assert response.status_code == 200
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert content.strip() == "Hello! How can I help you today?"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_completions_unary_and_stream(client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "The capital of France", "max_tokens": 8, "temperature": 0}
    unary = client.post("/v1/completions", json=body)
    assert unary.status_code == 200, unary.text
    text = unary.json()["choices"][0]["text"]
    streamed = sse_payloads(client.post("/v1/completions", json={**body, "stream": True}).text)
    assert streamed[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1] if e["choices"]) == text
    assert unary.json()["usage"]["completion_tokens"] == 8


def test_openai_sdk_chat(graph: Any) -> None:
    from openai import OpenAI

    sdk = OpenAI(base_url=f"{graph.base_url}/v1", api_key="unused")
    reply = sdk.chat.completions.create(model=MODEL, messages=HI["messages"], temperature=0)
    assert reply.choices[0].message.content is not None
    assert reply.choices[0].message.content.strip() == "Hello! How can I help you today?"
    stream = sdk.chat.completions.create(
        model=MODEL, messages=HI["messages"], temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.strip() == "Hello! How can I help you today?"
