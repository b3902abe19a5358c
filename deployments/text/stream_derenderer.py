"""Stateful stream derenderer: generate token chunks → OpenAI chunks, O(1) a token.

vLLM's stateless streaming derender (``OnlineDerenderer._derender_chat_stream_parsed``)
cannot keep a parser between HTTP calls, so each chunk rebuilds the parser and
replays ``parse_delta`` over the whole history: O(n²) per stream. Inside a Ray
Serve replica a stream lives in one process for its whole life, so this class
keeps, per choice, one parser and one incremental detokenizer and feeds
each chunk through them once.

It is built only from vLLM's pieces: the parser class from ``ParserManager``
(via the ``OnlineDerenderer`` that vLLM's app state builds), the incremental
detokenizer vLLM's engine decodes a request's output with (``StreamDecoder``) and
vLLM's logprob resolution. Paths with no per-stream parser state (plain chat, and
completions) go straight to ``OnlineDerenderer``'s own stream functions, with
the carried ``DerenderStreamState`` kept in memory instead of round-tripping
through a client.

One class serves both placements: inline (in the Generate replica, next to
the engine) and tier (in a Derender replica).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionStreamResponse,
)
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderStreamState,
    GenerateTokensStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import CompletionTokenUsageInfo, UsageInfo
from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
from vllm.parser import Parser
from vllm.renderers.online_derenderer import OnlineDerenderer

from deployments.text.echo import with_echo
from deployments.text.reasoning_count import ReasoningCounter
from deployments.text.stop_strings import StopStringHoldback, ended_on_stop_token
from deployments.vllm_adapter.internals import (
    StreamDecoder,
    chat_template_kwargs,
    decode_params,
    logprob_context_tail,
    resolve_logprobs,
)


def stop_strings(request: ChatCompletionRequest | CompletionRequest) -> list[str] | None:
    stop = request.stop
    return [stop] if isinstance(stop, str) else stop


@dataclass
class _ParsedChoice:
    """What one parsed chat choice keeps between chunks."""

    parser: Parser
    detok: StreamDecoder
    holdback: StopStringHoldback
    role_sent: bool = False
    tools_streamed: bool = False
    logprob_context: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    """Every token so far, kept only to count reasoning tokens for usage."""


def _usage(
    chunk: GenerateTokensStreamResponse, prompt_tokens: int, reasoning_tokens: int | None = None
) -> UsageInfo | None:
    if chunk.usage is None:
        return None
    completion = chunk.usage.completion_tokens or 0
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
        completion_tokens_details=None
        if reasoning_tokens is None
        else CompletionTokenUsageInfo(reasoning_tokens=reasoning_tokens),
    )


class ChatStreamDerenderer:
    """One chat stream: feed it each generate chunk, get the OpenAI chunk back."""

    def __init__(
        self,
        derenderer: OnlineDerenderer,
        chat_request: ChatCompletionRequest,
        prompt_token_ids: list[int],
        model_name: str,
        counter: ReasoningCounter | None = None,
    ) -> None:
        """``counter``: the replica's, kept across streams (one is made if none)."""
        self._derenderer = derenderer
        self._request = chat_request
        self._prompt_token_ids = prompt_token_ids
        self._model_name = model_name
        self._tokenizer = derenderer.renderer.get_tokenizer()
        self._parsed = derenderer.parser is not None
        self._choices: dict[int, _ParsedChoice] = {}
        # Plain path: vLLM's own stream function, state carried here per choice.
        self._plain_states: dict[int, DerenderStreamState | None] = {}
        self._plain_holdbacks: dict[int, StopStringHoldback] = {}
        self._template_kwargs: dict[str, Any] | None = None
        skip_special, spaces = decode_params(
            self._tokenizer, chat_request, preserve_special=self._parsed
        )
        self._skip_special = skip_special
        self._spaces_between = spaces
        self._counter = counter or ReasoningCounter(derenderer)
        # As vLLM's chat server: usage counts reasoning tokens when a reasoning parser runs.
        self._counts_reasoning = self._counter.counts
        self._role_opened = False

    def opening(self, request_id: str) -> list[ChatCompletionStreamResponse]:
        """The chunks vLLM's chat server opens a stream with, at the engine's first
        output: per choice, only the role (and ``content: ""``), with the prompt's token
        ids under ``return_token_ids`` and a zero usage under continuous usage. The
        chunks that follow carry no role."""
        request = self._request
        role = "assistant" if request.add_generation_prompt else request.messages[-1]["role"]
        prompt_tokens = len(self._prompt_token_ids)
        options = request.stream_options
        continuous = bool(options and options.include_usage and options.continuous_usage_stats)
        chunks = []
        for index in range(request.n or 1):
            # Built with the fields vLLM names, so its ``exclude_unset`` dump is vLLM's.
            chunk = ChatCompletionStreamResponse(
                id=request_id,
                object="chat.completion.chunk",
                created=int(time.time()),
                choices=[
                    ChatCompletionResponseStreamChoice(
                        index=index,
                        delta=DeltaMessage(role=role, content=""),
                        logprobs=None,
                        finish_reason=None,
                    )
                ],
                model=self._model_name,
                prompt_token_ids=self._prompt_token_ids if request.return_token_ids else None,
                prompt_text=None,
            )
            if continuous:
                chunk.usage = UsageInfo(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=0,
                    total_tokens=prompt_tokens,
                    completion_tokens_details=CompletionTokenUsageInfo(reasoning_tokens=0)
                    if self._counts_reasoning
                    else None,
                )
            chunks.append(chunk)
            if self._parsed:
                self._choice(index).role_sent = True
        self._role_opened = True
        return chunks

    async def feed(self, chunk: GenerateTokensStreamResponse) -> ChatCompletionStreamResponse:
        if not self._parsed:
            out = await self._feed_plain(chunk)
            if self._role_opened:
                for choice in out.choices:  # vLLM's derender puts it on the first content
                    choice.delta.role = None
            return out
        return self.feed_parsed(chunk)

    async def _feed_plain(
        self, chunk: GenerateTokensStreamResponse
    ) -> ChatCompletionStreamResponse:
        index = chunk.choices[0].index if chunk.choices else -1
        state = self._plain_states.get(index)
        out, new_state = await self._derenderer.derender_chat_stream(
            model=self._model_name,
            generate_chunk=chunk,
            state=state,
            chat_request=self._request,
            prompt_tokens=len(self._prompt_token_ids),
            prompt_token_ids=self._prompt_token_ids,
        )
        if index >= 0:
            self._plain_states[index] = new_state
        for choice in out.choices:
            holdback = self._plain_holdbacks.setdefault(choice.index, self._new_holdback())
            text = holdback.push(
                choice.delta.content or "", choice.finish_reason, choice.stop_reason
            )
            choice.delta.content = text or None
        return out

    def _new_holdback(self) -> StopStringHoldback:
        return StopStringHoldback(
            stop_strings(self._request), self._request.include_stop_str_in_output
        )

    def _choice(self, index: int) -> _ParsedChoice:
        state = self._choices.get(index)
        if state is None:
            detok = StreamDecoder(
                self._derenderer,
                self._tokenizer,
                self._prompt_token_ids,
                skip_special_tokens=self._skip_special,
                spaces_between_special_tokens=self._spaces_between,
                request_id=self._request.request_id,
            )
            holdback = self._new_holdback()
            state = self._choices[index] = _ParsedChoice(self._new_parser(), detok, holdback)
        return state

    def _chat_template_kwargs(self) -> dict[str, Any]:
        if self._template_kwargs is None:
            self._template_kwargs = chat_template_kwargs(self._derenderer, self._request)
        return self._template_kwargs

    def _new_parser(self) -> Parser:
        assert self._derenderer.parser is not None
        tools: Any = self._request.tools  # vLLM passes chat tools here too
        return self._derenderer.parser(
            self._tokenizer,
            tools,
            chat_template_kwargs=self._chat_template_kwargs(),
            model_config=self._derenderer.model_config,
        )

    def feed_parsed(self, chunk: GenerateTokensStreamResponse) -> ChatCompletionStreamResponse:
        """The parsed path: one ``parse_delta`` per engine chunk, no replay. A chunk
        with no choices and no usage has nothing to write (the parser held its text)."""
        request = self._request
        stream_choices: list[ChatCompletionResponseStreamChoice] = []
        return_token_ids = bool(request.return_token_ids and request.include_reasoning)
        for choice in chunk.choices:
            state = self._choice(choice.index)
            delta_ids = list(choice.token_ids or [])
            if self._counts_reasoning:
                state.generated += delta_ids
            finished = choice.finish_reason is not None
            delta: DeltaMessage | None = None
            if delta_ids or finished:
                text = ""
                text_ids = delta_ids
                if ended_on_stop_token(
                    choice.finish_reason, choice.stop_reason, request.include_stop_str_in_output
                ):
                    # As the engine's detokenizer: the stop token has no text.
                    text_ids = delta_ids[:-1]
                if text_ids:
                    text = state.detok.decode(text_ids)
                text = state.holdback.push(text, choice.finish_reason, choice.stop_reason)
                delta = state.parser.parse_delta(
                    text,
                    delta_ids,
                    request,
                    prompt_token_ids=self._prompt_token_ids,
                    finished=finished,
                )
            logprobs = None
            if choice.logprobs is not None and request.include_reasoning:
                # Hidden reasoning would leak through decoded logprob tokens,
                # so vLLM drops logprobs then; keep the same rule.
                logprobs = resolve_logprobs(choice.logprobs, self._tokenizer, state.logprob_context)
            state.logprob_context = logprob_context_tail(state.logprob_context, delta_ids)
            if delta is None:
                # As vLLM's chat server: a step the parser holds everything of (`<think>`,
                # a tool call's opening) writes no chunk, unless the client asked for
                # every step's logprobs or token ids. Its ids still count in usage.
                if state.role_sent and not finished and logprobs is None and not return_token_ids:
                    continue
                delta = DeltaMessage()
            if delta.tool_calls:
                state.tools_streamed = True
            if not state.role_sent:
                delta.role = "assistant"
                state.role_sent = True

            finish_reason = choice.finish_reason
            named_tool = type(request.tool_choice) is ChatCompletionNamedToolChoiceParam
            if finish_reason is not None and state.tools_streamed and not named_tool:
                finish_reason = "tool_calls"
            stream_choice = ChatCompletionResponseStreamChoice(
                index=choice.index,
                delta=delta,
                logprobs=logprobs,
                finish_reason=finish_reason,
                stop_reason=choice.stop_reason,
                token_ids=choice.token_ids if return_token_ids else None,
            )
            stream_choices.append(maybe_filter_parallel_tool_calls(stream_choice, request))

        # Every choice skipped: no chunk at all, its continuous usage included (vLLM's).
        skipped = bool(chunk.choices) and not stream_choices
        return ChatCompletionStreamResponse(
            id=chunk.request_id,
            model=self._model_name,
            choices=stream_choices,
            usage=None
            if skipped
            else _usage(chunk, len(self._prompt_token_ids), self._reasoning_tokens(chunk)),
            metrics=chunk.metrics,
        )

    def _reasoning_tokens(self, chunk: GenerateTokensStreamResponse) -> int | None:
        """Reasoning tokens for the chunk's usage.

        Continuous usage (a choice's chunk) reads the stream parser's running
        count, as vLLM's chat server does. The final usage is counted over each
        choice's whole output, as vLLM counts a unary response
        (``reasoning_count.py``): the running count of vLLM's engine-based parsers follows how
        tokens happened to be grouped into chunks (and stop-string holdback
        shifts text against ids), so under load the same output streamed twice
        could report different counts.
        """
        if chunk.usage is None or not self._counts_reasoning:
            return None
        if chunk.choices:
            choices = [self._choices[c.index] for c in chunk.choices]
            return sum(c.parser.count_reasoning_tokens(tuple(c.generated)) for c in choices)
        kwargs = self._chat_template_kwargs()
        return sum(self._counter.count(kwargs, c.generated) for c in self._choices.values())


class CompletionStreamDerenderer:
    """One completion stream; vLLM's detokenization with the window kept here."""

    def __init__(
        self,
        derenderer: OnlineDerenderer,
        completion_request: CompletionRequest,
        prompt_token_ids: list[int],
        model_name: str,
        echo: str | None = None,
    ) -> None:
        """``echo``: the prompt's text, which each choice's first chunk starts with
        (``completion_request.echo``; ``text/echo.py``)."""
        self._derenderer = derenderer
        self._request = completion_request
        self._prompt_token_ids = prompt_token_ids
        self._model_name = model_name
        self._echo = echo
        self._echoed: set[int] = set()
        self._states: dict[int, DerenderStreamState | None] = {}
        self._holdbacks: dict[int, StopStringHoldback] = {}

    async def feed(self, chunk: GenerateTokensStreamResponse) -> CompletionStreamResponse:
        index = chunk.choices[0].index if chunk.choices else -1
        out, new_state = await self._derenderer.derender_completion_stream(
            model=self._model_name,
            generate_chunk=chunk,
            state=self._states.get(index),
            prompt_tokens=len(self._prompt_token_ids),
            completion_request=self._request,
            prompt_token_ids=self._prompt_token_ids,
        )
        if index >= 0:
            self._states[index] = new_state
        for choice in out.choices:
            holdback = self._holdbacks.setdefault(
                choice.index,
                StopStringHoldback(
                    stop_strings(self._request), self._request.include_stop_str_in_output
                ),
            )
            choice.text = holdback.push(choice.text, choice.finish_reason, choice.stop_reason)
            if self._echo is not None and choice.index not in self._echoed:
                self._echoed.add(choice.index)
                choice.text = with_echo(self._request, self._echo, choice.text)
        return out
