"""The stateful stream derenderer against vLLM's stateless per-chunk derender.

Pure logic on vLLM's real classes (tokenizer, qwen3 + hermes parsers,
OnlineDerenderer) and no engine: the same token chunks go through vLLM's
``derender_chat_stream`` (replay per chunk, state carried as a client would)
and through ours (parser kept alive); the assembled messages must be equal.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateTokensStreamChoice,
    GenerateTokensStreamResponse,
)

from bench.harness.servers import TINY_MODEL
from deployments.config.graph_config import GraphConfig
from deployments.render import build_render_state
from deployments.text.reasoning_count import ReasoningCounter
from deployments.text.stream_derenderer import ChatStreamDerenderer
from scripts.build_tiny_model import WEATHER_TOOL

MODEL = str(TINY_MODEL)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("<think>\n\n</think>\n\nHello! How can I help you today?", {}),
    "reasoning": (
        "<think>\nThe user asks for 2 plus 3. 2 plus 3 is 5.\n</think>\n\nThe answer is 5.",
        {},
    ),
    "tools": (
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>',
        {"tools": [WEATHER_TOOL]},
    ),
    "reasoning+tool": (
        "<think>\nI need the weather in Oslo first.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        {"tools": [WEATHER_TOOL]},
    ),
}


@pytest.fixture(scope="module")
def vllm_state() -> Any:
    config = GraphConfig.from_args({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"})
    return asyncio.run(build_render_state(config))


def chunks_of(token_ids: list[int], size: int) -> list[GenerateTokensStreamResponse]:
    out = []
    for start in range(0, len(token_ids), size):
        last = start + size >= len(token_ids)
        out.append(
            GenerateTokensStreamResponse(
                request_id="r",
                choices=[
                    GenerateTokensStreamChoice(
                        index=0,
                        token_ids=token_ids[start : start + size],
                        # "length": no stop token, whose text vLLM's stateless
                        # path would keep and the engine's detokenizer drops.
                        finish_reason="length" if last else None,
                    )
                ],
            )
        )
    return out


def assemble(chunks: list[Any]) -> dict[str, Any]:
    content, reasoning, finish = "", "", None
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += delta.reasoning or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    for entry in calls.values():
        entry["arguments"] = json.loads(entry["arguments"]) if entry["arguments"] else {}
        entry["id_prefix"] = entry.pop("id")[:8]
    return {"content": content, "reasoning": reasoning, "tools": calls, "finish": finish}


@pytest.mark.parametrize("chunk_size", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_vllm_stateless_derender(vllm_state: Any, case: str, chunk_size: int) -> None:
    text, extra = CASES[case]
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **extra}
    )
    rendered = asyncio.run(vllm_state.serving_render.render_chat_request(request))
    prompt = rendered.token_ids
    tokenizer = vllm_state.online_derenderer.renderer.get_tokenizer()
    output = tokenizer.encode(text, add_special_tokens=False)
    derenderer = vllm_state.online_derenderer

    async def stateless() -> list[Any]:
        out, state = [], None
        for chunk in chunks_of(output, chunk_size):
            step, state = await derenderer.derender_chat_stream(
                model=MODEL,
                generate_chunk=chunk,
                state=state,
                chat_request=request,
                prompt_tokens=len(prompt),
                prompt_token_ids=prompt,
            )
            out.append(step)
        return out

    async def stateful() -> list[Any]:
        ours = ChatStreamDerenderer(derenderer, request, prompt, MODEL)
        return [await ours.feed(chunk) for chunk in chunks_of(output, chunk_size)]

    theirs = assemble(asyncio.run(stateless()))
    mine = assemble(asyncio.run(stateful()))
    assert mine == theirs
    if "tool" in case:
        assert mine["tools"][0]["name"] == "get_weather"
        assert mine["finish"] == "tool_calls"
    if case.startswith("reasoning"):
        assert "first" in mine["reasoning"] or "plus" in mine["reasoning"]


def _groupings(n: int) -> list[list[int]]:
    """Chunk sizes covering ``n`` tokens: one by one, and runs of 2–4 at every offset."""
    out = [[1] * n]
    for size in (2, 3, 4):
        for at in range(n - size + 1):
            out.append([1] * at + [size] + [1] * (n - at - size))
    return out


@pytest.mark.parametrize("stop", [None, ["Rome"]])
def test_streamed_reasoning_tokens_do_not_depend_on_how_tokens_are_chunked(
    vllm_state: Any, stop: list[str] | None
) -> None:
    # vLLM's qwen3 parser keeps a running reasoning count while it streams, and
    # that count changes with the chunking (and with stop-string holdback, which
    # shifts text against ids); the engine's output merges tokens into one chunk
    # whenever its consumer falls behind. The final usage must not follow that.
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": stop}
    )
    prompt = asyncio.run(vllm_state.serving_render.render_chat_request(request)).token_ids
    derenderer = vllm_state.online_derenderer
    tokenizer = derenderer.renderer.get_tokenizer()
    output = tokenizer.encode(
        "<think>\n\n</think>\n\nThe capital of Italy is Rome", add_special_tokens=False
    )
    # As vLLM counts a unary response: the reasoning parser over all the ids.
    reasoning_parser = derenderer.parser.reasoning_parser_cls(tokenizer)
    want = reasoning_parser.count_reasoning_tokens(output)
    assert want == 2

    counter = ReasoningCounter(derenderer)  # one per replica, across its streams

    async def final_usage(sizes: list[int]) -> Any:
        ours = ChatStreamDerenderer(derenderer, request, prompt, MODEL, counter)
        start = 0
        for i, size in enumerate(sizes):
            last = i == len(sizes) - 1
            choice = GenerateTokensStreamChoice(
                index=0,
                token_ids=output[start : start + size],
                finish_reason=("stop" if last else None) if stop else ("length" if last else None),
                stop_reason="Rome" if stop and last else None,
            )
            await ours.feed(GenerateTokensStreamResponse(request_id="r", choices=[choice]))
            start += size
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(output)}
        return await ours.feed(
            GenerateTokensStreamResponse.model_validate(
                {"request_id": "r", "choices": [], "usage": usage}
            )
        )

    for sizes in _groupings(len(output)):
        usage = asyncio.run(final_usage(sizes)).usage
        assert usage.completion_tokens_details.reasoning_tokens == want, sizes


@pytest.mark.parametrize("n", [1, 2])
def test_after_the_opening_chunks_no_chunk_carries_the_role(vllm_state: Any, n: int) -> None:
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": n}
    )
    derenderer = vllm_state.online_derenderer
    tokenizer = derenderer.renderer.get_tokenizer()
    output = tokenizer.encode(CASES["chat"][0], add_special_tokens=False)
    ours = ChatStreamDerenderer(derenderer, request, [1, 2, 3], MODEL)
    opening = ours.opening("chatcmpl-1")
    assert [(c.id, c.choices[0].index) for c in opening] == [("chatcmpl-1", i) for i in range(n)]
    assert all(c.choices[0].delta.role == "assistant" for c in opening)
    assert all(c.choices[0].delta.content == "" for c in opening)
    assert opening[0].prompt_token_ids is None  # only with return_token_ids
    later = [asyncio.run(ours.feed(chunk)) for chunk in chunks_of(output, 2)]
    assert [c.choices[0].delta.role for c in later] == [None] * len(later)
    assert assemble(later)["content"].strip() == "Hello! How can I help you today?"


@pytest.mark.parametrize("return_token_ids", [False, True])
def test_a_step_the_parser_holds_whole_writes_no_chunk(
    vllm_state: Any, return_token_ids: bool
) -> None:
    """As vLLM's chat server (compared with it in tests/integration/test_parity_vllm.py):
    the step of ``<think>``, which the reasoning parser holds, writes no chunk, unless
    the client asked for every step's token ids; its continuous usage goes with it."""
    request = ChatCompletionRequest.model_validate(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "return_token_ids": return_token_ids,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )
    derenderer = vllm_state.online_derenderer
    tokenizer = derenderer.renderer.get_tokenizer()
    output = tokenizer.encode(CASES["reasoning"][0], add_special_tokens=False)
    think = output[:1]
    assert tokenizer.decode(think) == "<think>"

    def first_step(opened: bool) -> Any:
        ours = ChatStreamDerenderer(derenderer, request, [1, 2, 3], MODEL)
        if opened:
            ours.opening("chatcmpl-1")
        step = GenerateTokensStreamResponse.model_validate(
            {
                "request_id": "r",
                "choices": [{"index": 0, "token_ids": think}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            }
        )
        return asyncio.run(ours.feed(step))

    held = first_step(opened=True)
    if return_token_ids:
        [choice] = held.choices
        assert choice.token_ids == think
        assert choice.delta.content is None and choice.delta.reasoning is None
        assert held.usage.completion_tokens == 1
    else:
        assert held.choices == [] and held.usage is None
    # A stream not opened by a role chunk (output_mode "derender") puts the role on
    # its first chunk, held step or not.
    [unopened] = first_step(opened=False).choices
    assert unopened.delta.role == "assistant"
