"""A unary chat choice from generated text, assembled as vLLM's coupled server does.

Mirrors ``OpenAIServingChat.chat_completion_full_generator``: one-shot
``parser.parse`` on the text the engine's detokenizer would have produced
(stop token dropped, stop string cut), the same message rules per
``tool_choice``, ``make_tool_call_id`` ids, the ``tool_calls`` finish-reason
rewrite, and ``parallel_tool_calls`` filtering. vLLM's batch ``/derender``
differs from that path (it keeps the stop token's text and uses bare uuids),
so the unary text placements use this instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.entrypoints.generate.base.protocol import ToolCall
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionLogProbs,
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionResponseChoice,
    ChatMessage,
)
from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.renderers.online_derenderer import OnlineDerenderer

from deployments.text.reasoning_count import ReasoningCounter
from deployments.vllm_adapter.internals import chat_template_kwargs


@dataclass
class GeneratedChoice:
    """One choice's output, as the engine's detokenizer would have left it."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: ChatCompletionLogProbs | None


def chat_choice(
    derenderer: OnlineDerenderer,
    request: ChatCompletionRequest,
    prompt_token_ids: list[int],
    out: GeneratedChoice,
    counter: ReasoningCounter,
) -> tuple[ChatCompletionResponseChoice, int]:
    """The response choice and its count of reasoning tokens (by ``counter``, the
    replica's: the count vLLM's parser gives after ``parse``)."""
    parser_cls = derenderer.parser
    logprobs = out.logprobs
    reasoning_tokens = 0
    tool_calls: Any = []
    if parser_cls is not None:
        tools: Any = request.tools
        template_kwargs = chat_template_kwargs(derenderer, request)
        parser = parser_cls(
            derenderer.renderer.get_tokenizer(),
            tools,
            chat_template_kwargs=template_kwargs,
            model_config=derenderer.model_config,
        )
        parser.set_prompt_token_ids(prompt_token_ids)
        reasoning, content, tool_calls = parser.parse(
            out.text,
            request,
            enable_auto_tools=derenderer.enable_auto_tools,
            model_output_token_ids=out.token_ids,
        )
        reasoning_tokens = counter.count(template_kwargs, out.token_ids)
        if not request.include_reasoning:
            reasoning, logprobs = None, None
    else:
        reasoning, content = None, out.text

    tool_parser_cls = parser_cls.tool_parser_cls if parser_cls is not None else None
    auto_tools = derenderer.enable_auto_tools and tool_parser_cls is not None
    named = type(request.tool_choice) is ChatCompletionNamedToolChoiceParam
    required = request.tool_choice == "required"
    calls = [ToolCall(id=tc.id or make_tool_call_id(), function=tc) for tc in tool_calls or []]
    auto_tools_called = False
    if named or required:
        message = ChatMessage(
            role="assistant", reasoning=reasoning, content=content or "", tool_calls=calls
        )
    elif auto_tools and request.tools and request.tool_choice in ("auto", None) and calls:
        auto_tools_called = True
        message = ChatMessage(
            role="assistant", reasoning=reasoning, content=content, tool_calls=calls
        )
    else:
        message = ChatMessage(role="assistant", reasoning=reasoning, content=content)

    tool_finish = auto_tools_called or (required and out.finish_reason == "stop")
    choice = ChatCompletionResponseChoice(
        index=out.index,
        message=message,
        logprobs=logprobs,
        finish_reason="tool_calls" if tool_finish else (out.finish_reason or "stop"),
        stop_reason=out.stop_reason,
        token_ids=out.token_ids
        if request.return_token_ids and (parser_cls is None or request.include_reasoning)
        else None,
    )
    return maybe_filter_parallel_tool_calls(choice, request), reasoning_tokens
