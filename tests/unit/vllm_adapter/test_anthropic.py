"""vLLM's Anthropic Messages serving through its one door
(``deployments/vllm_adapter/anthropic.py``), built without an engine, on the tiny
model's renderer: each piece the graph uses fails here, naming vLLM's symbol, if a
vLLM upgrade changes what it reads or does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vllm.entrypoints.anthropic.protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

from bench.harness.servers import TINY_MODEL
from deployments.config.graph_config import GraphConfig
from deployments.render import build_render_state
from deployments.transport.coalesce import NoOutputEvent, marks_followed
from deployments.vllm_adapter.anthropic import (
    MessagesConversion,
    anthropic_events,
    anthropic_message,
    count_tokens_response,
)
from scripts.build_tiny_model import WEATHER_TOOL
from tests.unit.vllm_adapter.test_internals import vllm_symbol

MODEL = str(TINY_MODEL)
TOOL = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}
MESSAGES = {
    "model": MODEL,
    "max_tokens": 32,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [TOOL],
}


@pytest.fixture(scope="module")
def conversion() -> MessagesConversion:
    config = GraphConfig.from_args({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"})
    state = asyncio.run(build_render_state(config))
    return MessagesConversion(state.serving_render.online_renderer)


def test_a_messages_request_converts_to_vllms_chat_request(
    conversion: MessagesConversion,
) -> None:
    request = AnthropicMessagesRequest.model_validate({**MESSAGES, "stream": True})
    with vllm_symbol("AnthropicServingMessages.to_chat_completion_request"):
        chat = asyncio.run(conversion.to_chat(request, served=True))
    assert [m["role"] for m in chat.messages] == ["system", "user"]  # type: ignore[index]
    assert chat.tools is not None and chat.tools[0].function.name == TOOL["name"]
    assert chat.model_dump(include={"max_tokens"}) == {"max_tokens": 32} and chat.stream
    # As vLLM's /v1/messages streams: usage on every chunk (its converter reads it).
    assert chat.stream_options is not None and chat.stream_options.continuous_usage_stats


def test_thinking_disabled_is_the_templates_probed_effort_when_served(
    conversion: MessagesConversion,
) -> None:
    body = {**MESSAGES, "thinking": {"type": "disabled"}}
    request = AnthropicMessagesRequest.model_validate(body)
    with vllm_symbol("AnthropicServingMessages._get_disabled_thinking_effort"):
        served = asyncio.run(conversion.to_chat(request, served=True))
        assert served.reasoning_effort in ("none", "low")
    # /v1/messages/render converts with vLLM's default, "none", and probes nothing.
    assert asyncio.run(conversion.to_chat(request, served=False)).reasoning_effort == "none"
    count = AnthropicCountTokensRequest.model_validate(
        {k: MESSAGES[k] for k in ("model", "messages")}
    )
    assert asyncio.run(conversion.to_chat(count, served=True)).messages


def test_count_tokens_answers_as_vllm() -> None:
    with vllm_symbol("AnthropicCountTokensResponse / AnthropicContextManagement"):
        answer = count_tokens_response(7).model_dump(exclude_none=True)
    assert answer == {"input_tokens": 7, "context_management": {"original_input_tokens": 7}}


def chat_response(**message: Any) -> ChatCompletionResponse:
    return ChatCompletionResponse.model_validate(
        {
            "id": "chatcmpl-1",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", **message},
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }
    )


def test_a_unary_chat_answer_converts_to_a_message() -> None:
    call = {"id": "call-1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    with vllm_symbol("AnthropicServingMessages.messages_full_converter"):
        message = anthropic_message(chat_response(reasoning="hm", content="ok", tool_calls=[call]))
    blocks = [block.type for block in message.content]
    assert blocks == ["thinking", "text", "tool_use"]
    assert message.content[2].input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"
    assert message.usage is not None and message.usage.output_tokens == 3


async def _collect(events: AsyncIterator[str]) -> list[str]:
    return [event async for event in events]


def chunk(choices: list[dict[str, Any]]) -> str:
    """A chat stream's SSE event, as vLLM's chat server writes one with usage."""
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": MODEL, "choices": choices, "usage": usage}  # fmt: skip
    return f"data: {json.dumps(body)}\n\n"


def test_a_chat_stream_converts_to_anthropic_events() -> None:
    async def chat() -> AsyncIterator[str]:
        yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        yield chunk([{"index": 0, "delta": {"reasoning": "hm"}}])
        yield chunk([{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}])
        yield chunk([])
        yield "data: [DONE]\n\n"

    with vllm_symbol("AnthropicServingMessages.message_stream_converter"):
        events = asyncio.run(_collect(anthropic_events(chat())))
    names = [event.split("\n", 1)[0].removeprefix("event: ") for event in events]
    assert names == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta",  # thinking
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",  # text
        "message_delta",
        "message_stop",
    ], names  # fmt: skip


def test_what_the_converter_writes_for_the_role_chunk_carries_no_output() -> None:
    """Anthropic's ``message_start`` answers the chat stream's role chunk: marked as
    that chunk is, it does not start a coalescing window, so the first text does not
    wait out the window behind it (``transport/coalesce.py``)."""

    async def chat() -> AsyncIterator[str]:
        yield NoOutputEvent(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}]))
        yield chunk([{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}])
        yield "data: [DONE]\n\n"

    events = asyncio.run(_collect(marks_followed(anthropic_events, chat())))
    marked = [event.split("\n", 1)[0] for event in events if isinstance(event, NoOutputEvent)]
    assert marked == ["event: message_start"], events
    assert any("content_block_delta" in event for event in events)
