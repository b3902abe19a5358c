"""Wire models between the graph's vLLM tiers (Render, Generate, Derender).

They exchange vLLM's own protocol models (``GenerateRequest``,
``ChatCompletionRequest``, ``ErrorResponse``, …) through DeploymentHandles;
this module adds only what vLLM has no model for. What crosses into the
Ingress, which imports no vLLM, is in ``messages/replies.py``; the control
plane's models are in ``messages/control.py``, for the same reason.
"""

from __future__ import annotations

import pickle
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionLogProbs,
    ChatCompletionRequest,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.entrypoints.serve.engine.protocol import UsageInfo

from deployments.messages.replies import RenderedText


class TextJob(BaseModel):
    """A rendered OpenAI request, ready to generate and derender into text."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    generate_request: GenerateRequest
    """What `/render` returned for the request; its `token_ids` seed detokenization."""
    chat_request: ChatCompletionRequest | None = None
    """The original chat request: tools, tool_choice, reasoning flags. Set for chat."""
    completion_request: CompletionRequest | None = None
    """The original completion request. Set for completions."""
    model_name: str
    """The model name echoed in responses (the request's `model`)."""
    batch: list[GenerateRequest] | None = None
    """Every prompt of a multi-prompt completion, in order, the first being
    ``generate_request``; None for one prompt."""
    response_id: str | None = None
    """A multi-prompt completion's id: vLLM names its prompts ``<id>-<i>`` and
    answers as ``<id>``."""
    echoed_prompts: list[str] | None = None
    """With ``echo``: each prompt's text as the client sent it, which vLLM's completion
    server puts before each choice's text (``prompt_texts``)."""
    responses_request: ResponsesRequest | None = None
    """The original Responses request (``/v1/responses``). Set for Responses."""
    api: Literal["openai", "anthropic", "responses"] = "openai"
    """The API the client speaks: ``anthropic`` (``/v1/messages``) is served as chat,
    and its output converted as vLLM's Messages server converts it; ``responses``
    (``/v1/responses``) as vLLM's Responses server builds its answer from engine
    outputs."""

    @property
    def beam_search(self) -> bool:
        """A completion with ``use_beam_search``: vLLM's completion server answers it
        next to the engine (``EngineCalls.serve_completion``)."""
        return bool(self.completion_request is not None and self.completion_request.use_beam_search)

    def rendered(
        self, *, reasoning_parser: bool, tool_parser: bool, trace: dict[str, str] | None = None
    ) -> RenderedText:
        """This job as it crosses the Ingress: pickled once, with what routing reads.
        The flags say which parsers the graph runs (``GraphConfig``); ``trace``, the
        context the tier that makes its text runs under."""
        request = self.generate_request
        sampling = request.sampling_params
        expected = None
        if sampling.max_tokens is not None:
            expected = sampling.max_tokens * sampling.n * len(self.batch or [request])
        return RenderedText(
            token_ids=request.token_ids,
            cache_salt=request.cache_salt,
            multimodal=request.features is not None,
            job=pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL),
            request_id=self.response_id or request.request_id,
            expected_tokens=expected,
            parsed=self.completion_request is None
            and (reasoning_parser or (tool_parser and self._offers_tools())),
            trace=trace,
            beside_engine=self.beam_search,
        )

    def _offers_tools(self) -> bool:
        chat = self.chat_request or self.responses_request
        return bool(chat is not None and chat.tools and chat.tool_choice != "none")


def prompt_texts(request: CompletionRequest) -> list[str] | None:
    """The text of each prompt of a completion request as vLLM's server echoes it (the
    text the client sent); None for prompts of token ids, which vLLM's server does not
    echo as text."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        texts = [p for p in prompt if isinstance(p, str)]
        return texts if len(texts) == len(prompt) else None
    return None


def prompt_key(key: str, prompt: int) -> str:
    """The key of one prompt's Generate call within the text call ``key`` (a
    multi-prompt completion in the tier makes one Generate call per prompt)."""
    return f"{key}/{prompt}"


def moved_key(key: str, move: int) -> str:
    """The key of a Generate call made again after ``move`` moves of its stream
    (``transport/migration.py``): its own on the step channel, since events of the
    lost call may still be on their way there (they travel apart from its error),
    and of the same text call."""
    return key if move == 0 else f"{key}~{move}"


def text_call_key(key: str) -> str:
    """The text call a Generate call's key belongs to (itself for a single prompt)."""
    return key.split("/", 1)[0].split("~", 1)[0]


class ParseContext(BaseModel):
    """What a parser needs of the original chat request (vLLM 0.33's ``parse_context``).

    ``/v1/chat/completions/render`` returns it beside the ``GenerateRequest``;
    ``/inference/v1/generate`` with ``output_mode: "derender"`` takes it back.
    """

    model_config = ConfigDict(extra="forbid")

    tools: list[dict[str, Any]] | None = None
    """The request's tools, as sent (OpenAI function tools)."""
    tool_choice: str | dict[str, Any] | None = None
    """``none`` / ``auto`` / ``required`` or a named function choice."""
    parallel_tool_calls: bool | None = True
    """False keeps only the first tool call, as vLLM does."""
    include_reasoning: bool = True
    """False drops reasoning from the message."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Template kwargs the prompt was rendered with (e.g. ``enable_thinking``)."""

    @classmethod
    def of(cls, request: ChatCompletionRequest) -> ParseContext:
        dumped = request.model_dump(
            include={"tools", "tool_choice", "parallel_tool_calls", "include_reasoning"},
            exclude_none=True,
        )
        return cls(**dumped, chat_template_kwargs=request.chat_template_kwargs)

    def chat_request(self, model: str) -> ChatCompletionRequest:
        """A chat request that carries this context to vLLM's parsers."""
        fields = self.model_dump(exclude_none=True)
        return ChatCompletionRequest.model_validate({"model": model, "messages": [], **fields})


class _DerenderEnvelope(BaseModel):
    """Fields shared by ``output_mode: "derender"`` responses and their chunks."""

    request_id: str
    created: int
    model: str
    output_mode: Literal["derender"] = "derender"
    usage: UsageInfo | None = None


class DerenderChoice(BaseModel):
    """One choice of a ``output_mode: "derender"`` response: the parsed message."""

    index: int
    message: ChatMessage
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    """Every generated token (None where reasoning is hidden, as in vLLM's chat)."""
    logprobs: ChatCompletionLogProbs | None = None
    """With ``sampling_params.logprobs``: each token's, decoded as vLLM's chat does."""


class GenerateDerenderResponse(_DerenderEnvelope):
    """``/inference/v1/generate`` with ``output_mode: "derender"`` (vLLM 0.33's shape)."""

    object: Literal["generate.derender"] = "generate.derender"
    choices: list[DerenderChoice]


class DerenderStreamChoice(BaseModel):
    """One step of a streamed ``derender`` choice: the message delta."""

    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    """This step's tokens (None where reasoning is hidden)."""
    logprobs: ChatCompletionLogProbs | None = None
    """This step's, with ``sampling_params.logprobs``."""


class GenerateDerenderStreamResponse(_DerenderEnvelope):
    """One SSE chunk of ``output_mode: "derender"`` (streaming is ours; vLLM has none)."""

    object: Literal["generate.derender.chunk"] = "generate.derender.chunk"
    choices: list[DerenderStreamChoice]
