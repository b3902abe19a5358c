"""Anthropic Messages on the graph against vLLM's own server (``vllm_server``), and the
Messages and Responses render routes against ``vllm launch render``.

``/v1/messages`` is served as the chat vLLM converts it to, in either placement, and
its output converted by vLLM's own converter in the tier that makes the text. What
differs by nature is normalised away: ids, thinking signatures (random per answer),
and how a stream's deltas are chunked (engine timing here, coalescing there).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from bench.harness.servers import Server
from scripts.build_tiny_model import TIME_TOOL, WEATHER_TOOL
from tests.integration.conftest import MODEL
from tests.integration.test_parity_vllm import id_format

PLACEMENTS = ("inline", "tier")


def tool(openai_tool: dict[str, Any]) -> dict[str, Any]:
    function = openai_tool["function"]
    return {
        "name": function["name"],
        "description": function["description"],
        "input_schema": function["parameters"],
    }


TOOLS = [tool(WEATHER_TOOL), tool(TIME_TOOL)]


def message(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 60,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


SHAPES = {
    "hi": message("hi", system="You are helpful."),
    "reasoning": message("think: what is 2 plus 3?"),
    "tools": message("What is the weather in Paris?", tools=TOOLS),
    "reasoning+tool": message("think: do I need an umbrella in Oslo?", tools=TOOLS),
    "named-tool": message(
        "What time is it in Rome?", tools=TOOLS, tool_choice={"type": "tool", "name": "get_time"}
    ),
    "thinking-disabled": message("hello", thinking={"type": "disabled"}),
    "stop-sequence": message("What is the capital of Italy?", stop_sequences=["Rome"]),
    "max-tokens": message("think: what is 2 plus 3?", max_tokens=5),
}


def normalised_block(block: dict[str, Any]) -> dict[str, Any]:
    block = dict(block)
    if "signature" in block:
        block["signature"] = "<signature>"  # a random uuid per answer, in vLLM too
    if block.get("type") == "tool_use":
        block["id"] = id_format(block["id"])
    return block


def unary(client: httpx.Client, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    response = client.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer.pop("id")
    answer["content"] = [normalised_block(b) for b in answer["content"]]
    return answer


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """A Messages stream as (event, data), each SSE event exactly once."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def assembled(stream: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The stream with ids and signatures normalised and each block's consecutive
    deltas joined: how many deltas carry a block's text follows chunking, not the answer."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, data in stream:
        data = json.loads(json.dumps(data))
        if name == "message_start":
            assert data["message"].pop("id")
        if name == "content_block_start":
            data["content_block"] = normalised_block(data["content_block"])
        if name == "content_block_delta" and data["delta"]["type"] == "signature_delta":
            data["delta"]["signature"] = "<signature>"
        last = out[-1] if out else None
        if (
            name == "content_block_delta"
            and last is not None
            and last[0] == name
            and last[1]["index"] == data["index"]
            and last[1]["delta"]["type"] == data["delta"]["type"] != "signature_delta"
        ):
            key = next(k for k in ("text", "thinking", "partial_json") if k in data["delta"])
            last[1]["delta"][key] += data["delta"][key]
            continue
        out.append((name, data))
    return out


def streamed(
    client: httpx.Client, body: dict[str, Any], headers: dict[str, str]
) -> list[tuple[str, dict[str, Any]]]:
    response = client.post("/v1/messages", json={**body, "stream": True}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return assembled(events(response.text))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_messages_equal_vllms(vllm_server: Server, client: httpx.Client, shape: str) -> None:
    body = SHAPES[shape]
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as reference:
        want_unary, want_stream = unary(reference, body, {}), streamed(reference, body, {})
    for placement in PLACEMENTS:
        headers = {"X-Text-Placement": placement}
        assert unary(client, body, headers) == want_unary, placement
        assert streamed(client, body, headers) == want_stream, placement


def test_the_shapes_are_what_they_say(vllm_server: Server) -> None:
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as reference:
        answers = {name: unary(reference, body, {}) for name, body in SHAPES.items()}
    assert [b["type"] for b in answers["reasoning"]["content"]] == ["thinking", "text"]
    assert answers["tools"]["stop_reason"] == "tool_use"
    assert answers["tools"]["content"][-1]["input"] == {"city": "Paris"}
    assert answers["named-tool"]["content"][-1]["name"] == "get_time"
    assert answers["stop-sequence"]["stop_reason"] == "stop_sequence"
    assert answers["stop-sequence"]["stop_sequence"] == "Rome"
    assert answers["max-tokens"]["stop_reason"] == "max_tokens"


COUNTED = {
    "plain": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "system+tools": {
        "model": MODEL,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS,
    },
}


@pytest.mark.parametrize("name", list(COUNTED))
def test_count_tokens_equals_vllms(vllm_server: Server, client: httpx.Client, name: str) -> None:
    body = COUNTED[name]
    want = httpx.post(f"{vllm_server.base_url}/v1/messages/count_tokens", json=body, timeout=60)
    assert want.status_code == 200, want.text
    got = client.post("/v1/messages/count_tokens", json=body)
    assert (got.status_code, got.json()) == (200, want.json())
    assert want.json()["input_tokens"] > 0


BAD = {
    "unknown model": ("/v1/messages", {**SHAPES["hi"], "model": "nope"}),
    "no max_tokens": ("/v1/messages", {k: v for k, v in SHAPES["hi"].items() if k != "max_tokens"}),
    "messages not a list": ("/v1/messages", {**SHAPES["hi"], "messages": "hi"}),
    "context too long": ("/v1/messages", {**SHAPES["hi"], "max_tokens": 10**6}),
    "count: unknown model": ("/v1/messages/count_tokens", {**COUNTED["plain"], "model": "nope"}),
    "count: no messages": ("/v1/messages/count_tokens", {"model": MODEL}),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_messages_get_vllms_answer(
    vllm_server: Server, client: httpx.Client, case: str
) -> None:
    """Status and body as vLLM's server answers them (Anthropic's error shape where
    vLLM's Messages routes translate, a 4xx in any case)."""
    path, body = BAD[case]
    want = httpx.post(f"{vllm_server.base_url}{path}", json=body, timeout=60)
    assert 400 <= want.status_code < 500, want.text
    for placement in PLACEMENTS:
        got = client.post(path, json=body, headers={"X-Text-Placement": placement})
        assert (got.status_code, got.json()) == (want.status_code, want.json()), placement


RENDERED_MESSAGES = {
    "plain": SHAPES["hi"],
    "tools": SHAPES["tools"],
    "thinking-disabled": SHAPES["thinking-disabled"],
}


@pytest.mark.parametrize("name", list(RENDERED_MESSAGES))
def test_messages_render_equals_vllm_launch_render(
    vllm_render: Server, client: httpx.Client, name: str
) -> None:
    body, headers = RENDERED_MESSAGES[name], {"X-Request-Id": f"render-{name}"}
    want = httpx.post(
        f"{vllm_render.base_url}/v1/messages/render", json=body, headers=headers, timeout=60
    )
    assert want.status_code == 200, want.text
    got = client.post("/v1/messages/render", json=body, headers=headers)
    assert (got.status_code, got.json()) == (200, want.json())
    assert want.json()["request_id"] == f"chatcmpl-render-{name}"


RESPONSES = {
    "plain": {"model": MODEL, "input": "hi", "max_output_tokens": 20},
    "instructions+tools": {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
    },
    "previous response": {"model": MODEL, "input": "hi", "previous_response_id": "resp_1"},
    "unknown model": {"model": "nope", "input": "hi"},
}


@pytest.mark.parametrize("name", list(RESPONSES))
def test_responses_render_equals_vllm_launch_render(
    vllm_render: Server, client: httpx.Client, name: str
) -> None:
    body = {**RESPONSES[name], "request_id": f"resp_render-{name.replace(' ', '-')}"}
    want = httpx.post(f"{vllm_render.base_url}/v1/responses/render", json=body, timeout=60)
    got = client.post("/v1/responses/render", json=body)
    assert (got.status_code, got.json()) == (want.status_code, want.json())
    if name in ("plain", "instructions+tools"):
        assert want.status_code == 200, want.text
    else:
        assert want.status_code in (400, 404), want.text


GREEDY = {"temperature": 0}


def sdk_for(graph: Server, placement: str) -> anthropic.Anthropic:
    """The official client, as a user makes one, pointed at the graph. (Its calls
    send ``temperature: 0``, in the body as this SDK version has no argument for it:
    Anthropic's default samples, and the checks read the tiny model's trained
    answers.)"""
    return anthropic.Anthropic(
        base_url=graph.base_url,
        api_key="unused",
        default_headers={"X-Text-Placement": placement},
        max_retries=0,
    )


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_the_anthropic_sdk_holds_a_tool_conversation(graph: Server, placement: str) -> None:
    """The official SDK, unchanged: a tool call, its result sent back, an answer;
    unary and streamed."""
    sdk = sdk_for(graph, placement)
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    first = sdk.messages.create(
        model=MODEL, max_tokens=60, extra_body=GREEDY, messages=[ask], tools=TOOLS
    )
    assert first.stop_reason == "tool_use"
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}
    conversation = [ask, {"role": "assistant", "content": first.content},
                    {"role": "user", "content": [result]}]  # fmt: skip
    with sdk.messages.stream(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        messages=conversation,
        tools=TOOLS,
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_message()
    assert {"message_start", "content_block_delta", "message_stop"} <= kinds, kinds
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert final.usage.output_tokens > 0 and final.content


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_the_anthropic_sdk_streams_thinking(graph: Server, placement: str) -> None:
    sdk = sdk_for(graph, placement)
    ask = {"role": "user", "content": "think: what is 2 plus 3?"}
    with sdk.messages.stream(
        model=MODEL, max_tokens=60, extra_body=GREEDY, messages=[ask]
    ) as stream:
        final = stream.get_final_message()
    thinking = [b for b in final.content if b.type == "thinking"]
    text = [b for b in final.content if b.type == "text"]
    assert thinking and "2 plus 3 is 5" in thinking[0].thinking
    assert text and text[0].text.strip() == "The answer is 5."
    assert final.stop_reason == "end_turn"
    # A second turn carries the first answer back, thinking block included.
    again = sdk.messages.create(
        model=MODEL,
        max_tokens=60,
        extra_body=GREEDY,
        messages=[
            ask,
            {"role": "assistant", "content": final.content},
            {"role": "user", "content": "think: and 2 plus 4?"},
        ],
    )
    assert again.content and again.usage.input_tokens > final.usage.input_tokens


def test_the_graphs_own_refusals_on_messages_are_in_anthropics_shape(
    client: httpx.Client,
) -> None:
    got = client.post("/v1/messages", json=SHAPES["hi"], headers={"X-Text-Placement": "gpu"})
    assert got.status_code == 400
    assert got.json()["type"] == "error"
    assert got.json()["error"]["type"] == "BadRequestError"
    assert "X-Text-Placement" in got.json()["error"]["message"]
