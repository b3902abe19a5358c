"""The Derender tier: placement routing, replicas, vLLM's /derender, output_mode derender."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.integration.conftest import GRAPH_ARGS, MODEL
from tests.integration.test_parity_vllm import SHAPES, normalise_message
from tests.integration.test_parity_vllm import streamed as streamed_chat
from tests.integration.test_skeleton import rendered, sse_payloads


def test_placement_header_routes_and_is_echoed(client: httpx.Client) -> None:
    body = {**SHAPES["chat"], "max_tokens": 20}
    default = client.post("/v1/chat/completions", json=body)
    assert default.headers["X-Text-Placement"] == "inline"
    messages = {}
    for placement in ("inline", "tier", "TIER"):
        response = client.post(
            "/v1/chat/completions", json=body, headers={"X-Text-Placement": placement}
        )
        assert response.status_code == 200, response.text
        assert response.headers["X-Text-Placement"] == placement.lower()
        assert response.headers["X-Served-By"]
        messages[placement] = response.json()["choices"][0]["message"]["content"]
    assert (
        messages["inline"] == messages["tier"] == default.json()["choices"][0]["message"]["content"]
    )


def test_bad_placement_header_is_400(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions", json=SHAPES["chat"], headers={"X-Text-Placement": "gpu"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Text-Placement"


def test_two_derender_replicas_each_serve_streams(client: httpx.Client) -> None:
    body = {**SHAPES["reasoning"], "max_tokens": 120, "stream": True}

    def one(_: int) -> tuple[str, int]:
        with httpx.Client(base_url=str(client.base_url), timeout=120) as c:
            response = c.post(
                "/v1/chat/completions", json=body, headers={"X-Text-Placement": "tier"}
            )
            assert response.status_code == 200, response.text
            events = sse_payloads(response.text)
            assert events[-1] == "[DONE]"
            return response.headers["X-Served-By"], len(events)

    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(one, range(8)))
    replicas = {replica for replica, _ in served}
    assert len(replicas) == 2, served


def generate_tokens(client: httpx.Client, body: dict[str, Any], stream: bool) -> Any:
    request = rendered(client, body)
    prompt = request["token_ids"]
    request.pop("parse_context")
    response = client.post("/inference/v1/generate", json={**request, "stream": stream})
    assert response.status_code == 200, response.text
    return prompt, (sse_payloads(response.text)[:-1] if stream else response.json())


def drop_volatile(value: Any) -> Any:
    """``created`` stamps and random tool-call ids differ between two runs."""
    if isinstance(value, dict):
        out = {k: drop_volatile(v) for k, v in value.items() if k != "created"}
        if "function" in out and "id" in out:
            out["id"] = "<tool-call-id>" if out["id"] else out["id"]
        if "last_tool_call_ids" in out:
            out["last_tool_call_ids"] = ["<tool-call-id>" for _ in out["last_tool_call_ids"]]
        return out
    if isinstance(value, list):
        return [drop_volatile(v) for v in value]
    return value


@pytest.fixture(scope="module")
def vllm_derender() -> Any:
    from deployments.config import GraphConfig
    from deployments.render import build_render_state

    return asyncio.run(build_render_state(GraphConfig.from_args(GRAPH_ARGS))).serving_derender


@pytest.mark.parametrize("shape", ["chat", "reasoning+tool"])
def test_derender_batch_equals_vllm(client: httpx.Client, vllm_derender: Any, shape: str) -> None:
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import DerenderChatRequest

    body = SHAPES[shape]
    prompt, generated = generate_tokens(client, body, stream=False)
    payload = {"generate_response": generated, "chat_request": body, "prompt_token_ids": prompt}
    ours = client.post("/v1/chat/completions/derender", json=payload)
    assert ours.status_code == 200, ours.text
    theirs = asyncio.run(
        vllm_derender.derender_chat_response(DerenderChatRequest.model_validate(payload))
    )
    assert drop_volatile(ours.json()) == drop_volatile(json.loads(theirs.model_dump_json()))


def test_derender_per_chunk_equals_vllm(client: httpx.Client, vllm_derender: Any) -> None:
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import DerenderChatStreamRequest

    body = SHAPES["reasoning+tool"]
    prompt, chunks = generate_tokens(client, body, stream=True)
    ours_state: Any = None
    theirs_state: Any = None
    for chunk in chunks:
        base = {"stream": True, "generate_chunk": chunk, "chat_request": body,
                "prompt_token_ids": prompt}  # fmt: skip
        ours = client.post(
            "/v1/chat/completions/derender", json={**base, "stream_state": ours_state}
        )
        assert ours.status_code == 200, ours.text
        request = DerenderChatStreamRequest.model_validate({**base, "stream_state": theirs_state})
        their_chunk, their_state = asyncio.run(vllm_derender.derender_chat_stream_response(request))
        theirs = {"chunk": their_chunk.model_dump(), "stream_state": their_state.model_dump()}
        assert drop_volatile(ours.json()) == drop_volatile(json.loads(json.dumps(theirs)))
        ours_state = ours.json()["stream_state"]
        theirs_state = their_state.model_dump()


def test_completion_derender_batch(client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "The capital of France", "max_tokens": 6, "temperature": 0}
    request = client.post("/v1/completions/render", json=body).json()[0]
    generated = client.post("/inference/v1/generate", json=request).json()
    text_mode = client.post("/inference/v1/generate", json={**request, "output_mode": "text"})
    payload = {"generate_responses": [generated], "prompt_token_ids": [request["token_ids"]]}
    ours = client.post("/v1/completions/derender", json=payload)
    assert ours.status_code == 200, ours.text
    assert ours.json()["choices"][0]["text"] == text_mode.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda p: p["generate_response"].update(output_mode="text", choices=[
            {**c, "text": "x"} for c in p["generate_response"]["choices"]]), "text"),
        (lambda p: p["generate_response"]["choices"][0].update(token_ids=[]), "token_ids"),
        (lambda p: p.pop("chat_request"), "chat_request"),
    ],
    ids=["text-response", "empty-token-ids", "parser-without-chat-request"],
)  # fmt: skip
def test_derender_rejects_bad_input(client: httpx.Client, mutate: Any, needle: str) -> None:
    body = SHAPES["chat"]
    prompt, generated = generate_tokens(client, body, stream=False)
    payload = {"generate_response": generated, "chat_request": body, "prompt_token_ids": prompt}
    mutate(payload)
    response = client.post("/v1/chat/completions/derender", json=payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and needle in error["message"]


@pytest.mark.parametrize("shape", ["reasoning", "tools-auto", "reasoning+tool"])
def test_output_mode_derender_matches_tier_chat(client: httpx.Client, shape: str) -> None:
    body = SHAPES[shape]
    request = rendered(client, body)
    assert request["parse_context"]["include_reasoning"] is True
    unary = client.post("/inference/v1/generate", json={**request, "output_mode": "derender"})
    assert unary.status_code == 200, unary.text
    assert unary.json()["output_mode"] == "derender"
    chat = client.post("/v1/chat/completions", json=body, headers={"X-Text-Placement": "tier"})
    want = normalise_message(chat.json()["choices"][0]["message"])
    got = unary.json()["choices"][0]
    assert normalise_message(got["message"]) == want
    assert got["finish_reason"] == chat.json()["choices"][0]["finish_reason"]

    # Streamed, against the streamed tier chat (vLLM's streamed and unary
    # chat differ on whitespace-only content beside tool calls).
    want = streamed_chat(client, body, {"X-Text-Placement": "tier"})["message"]
    streamed = client.post(
        "/inference/v1/generate", json={**request, "output_mode": "derender", "stream": True}
    )
    events = sse_payloads(streamed.text)
    assert events[-1] == "[DONE]"
    content, reasoning, calls = "", "", {}
    for event in events[:-1]:
        assert event["output_mode"] == "derender"
        for choice in event["choices"]:
            content += choice["delta"].get("content") or ""
            reasoning += choice["delta"].get("reasoning") or ""
            for call in choice["delta"].get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                entry["name"] += (call.get("function") or {}).get("name") or ""
                entry["arguments"] += (call.get("function") or {}).get("arguments") or ""
    assert (content or None) == want["content"]
    assert (reasoning or None) == want["reasoning"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c["name"], c["arguments"]) for c in want["tool_calls"]
    ]
    assert events[-2]["choices"][0]["finish_reason"] == got["finish_reason"]


# U+2028, U+2029 and U+0085 end a line for ``str.splitlines`` but not for SSE,
# and JSON writers leave them unescaped inside strings.
UNICODE_LINE_ENDS = "a\u2028b\u2029c\u0085d"


@pytest.mark.parametrize("stream", [True, False])
def test_text_with_unicode_line_ends_streams_whole_in_derender_mode(
    client: httpx.Client, stream: bool
) -> None:
    """The engine is made to write U+2028/U+2029/U+0085 (a regex grammar) and the
    derender stream carries them as text, not as broken events."""
    body = {
        **SHAPES["no-thinking"],
        "structured_outputs": {"regex": UNICODE_LINE_ENDS},
        "max_tokens": 40,
    }
    request = {**rendered(client, body), "output_mode": "derender", "stream": stream}
    response = client.post("/inference/v1/generate", json=request)
    assert response.status_code == 200, response.text
    if not stream:
        assert response.json()["choices"][0]["message"]["content"] == UNICODE_LINE_ENDS
        return
    assert response.text.count("data: ") == len(response.text.split("\n\n")) - 1
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    content = "".join(
        choice["delta"].get("content") or "" for event in events[:-1] for choice in event["choices"]
    )
    assert content == UNICODE_LINE_ENDS
