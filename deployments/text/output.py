"""OpenAI text output for a :class:`TextJob`, from a source of generate output.

Both placements run this same code: inline, the source is the engine in the
same Generate replica; tier, the source is a streamed DeploymentHandle call to
Generate. Streams go through the stateful stream derenderer; unary responses
through vLLM's own batch derender (``ServingDerender``), exactly as its
``/v1/chat/completions/derender`` computes them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from http import HTTPStatus
from typing import Any, cast

from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionResponse,
    CompletionStreamResponse,
)
from vllm.entrypoints.scale_out.derender.serving import ServingDerender
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderCompletionRequest,
    GenerateRequest,
    GenerateTokensResponse,
    GenerateTokensStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import (
    CompletionTokenUsageInfo,
    ErrorResponse,
    UsageInfo,
)
from vllm.renderers.online_derenderer import OnlineDerenderer
from vllm.utils.async_utils import merge_async_iterators

from deployments.messages.replies import Reply
from deployments.messages.tier import TextJob
from deployments.text.chat_choice import GeneratedChoice, chat_choice
from deployments.text.echo import with_echo
from deployments.text.reasoning_count import ReasoningCounter
from deployments.text.responses_output import ResponsesOutput
from deployments.text.sse import DONE, PayloadTap, sse_data, sse_event, sse_stream_payloads
from deployments.text.stop_strings import cut_at_stop, ended_on_stop_string, ended_on_stop_token
from deployments.text.stream_derenderer import ChatStreamDerenderer, CompletionStreamDerenderer
from deployments.transport.coalesce import NoOutputEvent, marks_followed
from deployments.vllm_adapter.anthropic import anthropic_events, anthropic_message
from deployments.vllm_adapter.internals import StreamDecoder, decode_params, resolve_logprobs

OpenAIChunk = ChatCompletionStreamResponse | CompletionStreamResponse
# Writes one OpenAI chunk as the SSE event the client gets.
ChunkEvent = Callable[[OpenAIChunk], str]


def openai_event(chunk: OpenAIChunk) -> str:
    """The chunk as vLLM's OpenAI server writes it; its final usage chunk (no
    choices) without null fields."""
    return sse_event(chunk, exclude_none=not chunk.choices and chunk.usage is not None)


def tokens_request(
    job: TextJob, *, stream: bool, prompt: GenerateRequest | None = None
) -> GenerateRequest:
    """The job's generate request (or ``prompt``, one of its batch), asking for tokens
    (we detokenize).

    The engine's own incremental detokenizer is turned off too: the text is
    made from the token ids next to the parser, inline or in the tier, so the
    engine's would be CPU spent on the engine's host for text nobody reads.
    Stop strings keep it on: vLLM matches them on the engine's text, and its
    semantics (which token ends the request) stay exact only there.
    """
    request = prompt or job.generate_request
    params = request.sampling_params
    update: dict[str, Any] = {"output_mode": "tokens", "stream": stream}
    if params.detokenize and not params.stop:
        params = copy.copy(params)
        params.detokenize = False
        update["sampling_params"] = params
    return request.model_copy(update=update)


def carries_output(chunk: OpenAIChunk) -> bool:
    """Whether a client sees anything in the chunk: text, reasoning, a tool call, an end,
    logprobs or usage (one that does not may leave without starting a coalescing
    window; ``transport/coalesce.py``)."""
    if chunk.usage is not None:
        return True
    for choice in chunk.choices:
        if choice.finish_reason is not None or choice.logprobs is not None:
            return True
        if isinstance(choice, ChatCompletionResponseStreamChoice):
            delta = choice.delta
            if delta.content or delta.reasoning or delta.tool_calls:
                return True
        elif choice.text:
            return True
    return False


class TextOutput:
    """Derenders one job's generate output into OpenAI responses."""

    def __init__(self, derenderer: OnlineDerenderer, serving_derender: ServingDerender) -> None:
        self._derenderer = derenderer
        self._serving = serving_derender
        self._reasoning = ReasoningCounter(derenderer)
        self._responses = ResponsesOutput(derenderer)

    async def respond(
        self,
        job: TextJob,
        result: ErrorResponse | GenerateTokensResponse | AsyncIterator[str],
        event: ChunkEvent = openai_event,
        role_chunk: bool = True,
        tap: PayloadTap | None = None,
    ) -> AsyncGenerator[Any, None]:
        """One generate result → what the client gets: the error value, the unary
        response, or the SSE stream (which a step channel batches with its other
        streams' events), each OpenAI chunk written once, by ``event``
        (``role_chunk``: ``stream``).
        ``tap`` sees each chat or completion stream's generate payloads."""
        if isinstance(result, ErrorResponse):
            yield result
            return
        if isinstance(result, GenerateTokensResponse) and job.api == "responses":
            yield await self._responses.unary(job, result)
            return
        if isinstance(result, GenerateTokensResponse):
            answer = await self.unary(job, result)
            if job.api == "anthropic" and isinstance(answer, ChatCompletionResponse):
                # As vLLM's /v1/messages writes it: without null fields.
                message = anthropic_message(answer).model_dump(exclude_none=True)
                yield Reply(HTTPStatus.OK.value, message)
                return
            yield answer
            return
        if job.api == "anthropic":
            # vLLM's converter reads the chat events as vLLM's chat server writes them.
            events = marks_followed(
                anthropic_events, self.stream(job, result, openai_event, role_chunk=True, tap=tap)
            )
        elif job.api == "responses":
            events = self._responses.stream(job, result)
        else:
            events = self.stream(job, result, event, role_chunk, tap)
        async with contextlib.aclosing(events) as items:
            async for item in items:
                yield item

    async def respond_batch(
        self,
        job: TextJob,
        results: Sequence[ErrorResponse | GenerateTokensResponse | AsyncIterator[str]],
        event: ChunkEvent = openai_event,
    ) -> AsyncGenerator[Any, None]:
        """``respond`` for a multi-prompt completion: one generate result per prompt of
        ``job.batch``, answered as vLLM answers the batch (choice ``index`` = prompt ×
        ``n`` + choice, one usage over all prompts). A prompt refused (the first
        error) is the answer; the caller closes the others' engine streams."""
        for result in results:
            if isinstance(result, ErrorResponse):
                yield result
                return
        if all(isinstance(result, GenerateTokensResponse) for result in results):
            yield await self._unary_completion(job, results)  # type: ignore[arg-type]
            return
        streams = [r for r in results if not isinstance(r, GenerateTokensResponse)]
        events = self._batch_stream(job, streams, event)  # type: ignore[arg-type]
        async with contextlib.aclosing(events) as items:
            async for item in items:
                yield item

    async def unary(
        self, job: TextJob, response: GenerateTokensResponse
    ) -> ChatCompletionResponse | CompletionResponse | ErrorResponse:
        if job.chat_request is not None:
            response = response.model_copy(update={"request_id": job.generate_request.request_id})
            return self._unary_chat(job, job.chat_request, response)
        return await self._unary_completion(job, [response])

    async def _unary_completion(
        self, job: TextJob, responses: list[GenerateTokensResponse]
    ) -> CompletionResponse | ErrorResponse:
        """One completion answer over every prompt's generate response, by vLLM's batch
        derender (it numbers the choices and sums the usage as vLLM's server does)."""
        assert job.completion_request is not None
        prompts = [r.token_ids for r in job.batch or [job.generate_request]]
        response_id = job.response_id or job.generate_request.request_id
        completion = await self._serving.derender_completion_response(
            DerenderCompletionRequest(
                model=job.model_name,
                generate_responses=[
                    r.model_copy(update={"request_id": response_id}) for r in responses
                ],
                prompt_tokens=[len(prompt) for prompt in prompts],
                prompt_token_ids=prompts,
                completion_request=job.completion_request,
            )
        )
        if isinstance(completion, CompletionResponse):
            request = job.completion_request
            include = request.include_stop_str_in_output
            n = request.n or 1
            for choice in completion.choices:
                if ended_on_stop_string(choice.finish_reason, choice.stop_reason, include):
                    assert isinstance(choice.stop_reason, str)
                    choice.text = cut_at_stop(choice.text, choice.stop_reason)
                if job.echoed_prompts is not None:  # choices run prompt by prompt, n each
                    echoed = job.echoed_prompts[choice.index // n]
                    choice.text = with_echo(request, echoed, choice.text)
        return completion

    def _unary_chat(
        self, job: TextJob, request: ChatCompletionRequest, response: GenerateTokensResponse
    ) -> ChatCompletionResponse | ErrorResponse:
        """As vLLM's coupled ``/v1/chat/completions`` builds a non-streamed response."""
        derenderer = self._derenderer
        tokenizer = derenderer.renderer.get_tokenizer()
        prompt = job.generate_request.token_ids
        skip, spaces = decode_params(
            tokenizer, request, preserve_special=derenderer.parser is not None
        )
        include_stop = request.include_stop_str_in_output
        choices, reasoning_tokens = [], 0
        for gen in response.choices:
            # None or empty: aborted before its first token; vLLM answers it, empty.
            text_ids = list(gen.token_ids or [])
            if ended_on_stop_token(gen.finish_reason, gen.stop_reason, include_stop):
                text_ids = text_ids[:-1]
            text = StreamDecoder(
                derenderer,
                tokenizer,
                prompt,
                skip_special_tokens=skip,
                spaces_between_special_tokens=spaces,
                request_id=job.generate_request.request_id,
            ).decode(text_ids)
            if ended_on_stop_string(gen.finish_reason, gen.stop_reason, include_stop):
                assert isinstance(gen.stop_reason, str)
                text = cut_at_stop(text, gen.stop_reason)
            logprobs = resolve_logprobs(gen.logprobs, tokenizer) if gen.logprobs else None
            generated = GeneratedChoice(
                gen.index,
                text,
                list(gen.token_ids or []),
                gen.finish_reason,
                gen.stop_reason,
                logprobs,
            )
            choice, reasoning = chat_choice(derenderer, request, prompt, generated, self._reasoning)
            choices.append(choice)
            reasoning_tokens += reasoning
        completion_tokens = sum(len(c.token_ids or []) for c in response.choices)
        parser = derenderer.parser
        return ChatCompletionResponse(
            id=job.generate_request.request_id,
            model=job.model_name,
            choices=choices,
            usage=UsageInfo(
                prompt_tokens=len(prompt),
                completion_tokens=completion_tokens,
                total_tokens=len(prompt) + completion_tokens,
                completion_tokens_details=CompletionTokenUsageInfo(
                    reasoning_tokens=reasoning_tokens
                )
                if parser is not None and parser.reasoning_parser_cls is not None
                else None,
            ),
            kv_transfer_params=response.kv_transfer_params,
            prompt_token_ids=prompt if request.return_token_ids else None,
        )

    async def _batch_stream(
        self, job: TextJob, sources: list[AsyncIterator[str]], event: ChunkEvent
    ) -> AsyncGenerator[str, None]:
        """Every prompt's generate stream in → one completion stream, as vLLM streams a
        batch: chunks in the order the engine makes them, each choice's ``index`` its
        prompt × ``n`` + its own, the response's id on every chunk, and one usage
        chunk over all prompts at the end (each prompt's own is summed into it)."""
        request = job.completion_request
        assert request is not None and job.batch is not None
        n = request.n or 1
        response_id = job.response_id or job.generate_request.request_id
        echoed: list[str | None] = (
            list(job.echoed_prompts) if job.echoed_prompts else [None] * len(job.batch)
        )
        feeders = [
            CompletionStreamDerenderer(
                self._derenderer, request, prompt.token_ids, job.model_name, echo
            )
            for prompt, echo in zip(job.batch, echoed, strict=True)
        ]
        prompt_tokens = completion_tokens = 0
        usage_seen = False
        payloads = [
            cast(AsyncGenerator[dict[str, Any], None], sse_stream_payloads(source))
            for source in sources
        ]
        async for prompt, payload in merge_async_iterators(*payloads):
            if "error" in payload:
                yield sse_data(payload)
                continue
            out = await feeders[prompt].feed(GenerateTokensStreamResponse.model_validate(payload))
            if not out.choices:  # this prompt's usage: summed into the batch's
                if out.usage is not None:
                    usage_seen = True
                    prompt_tokens += out.usage.prompt_tokens
                    completion_tokens += out.usage.completion_tokens or 0
                continue
            for choice in out.choices:
                choice.index += prompt * n
            out.id = response_id
            yield event(out)
        if usage_seen:
            usage = UsageInfo(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            )
            final = CompletionStreamResponse(
                id=response_id, model=job.model_name, choices=[], usage=usage
            )
            yield event(final)
        yield f"data: {DONE}\n\n"

    async def stream(
        self,
        job: TextJob,
        source: AsyncIterator[str],
        event: ChunkEvent = openai_event,
        role_chunk: bool = True,
        tap: PayloadTap | None = None,
    ) -> AsyncGenerator[str, None]:
        """Generate SSE events in → OpenAI chunks, written by ``event``, ending in ``[DONE]``.

        A chat stream opens as vLLM's chat server opens one (``role_chunk``): a
        role-only chunk per choice at the engine's first output, written as vLLM
        writes it. ``output_mode: "derender"`` streams do not: vLLM's derender puts the
        role on the first content.

        Error events from generate pass through unchanged; vLLM sends them as
        ``data: {"error": …}`` followed by ``[DONE]``.
        """
        prompt = job.generate_request.token_ids
        feeder: ChatStreamDerenderer | CompletionStreamDerenderer
        if job.chat_request is not None:
            feeder = ChatStreamDerenderer(
                self._derenderer, job.chat_request, prompt, job.model_name, self._reasoning
            )
        else:
            assert job.completion_request is not None
            echoed = job.echoed_prompts
            feeder = CompletionStreamDerenderer(
                self._derenderer,
                job.completion_request,
                prompt,
                job.model_name,
                None if echoed is None else echoed[0],
            )
        response_id = job.generate_request.request_id
        to_open = feeder if role_chunk and isinstance(feeder, ChatStreamDerenderer) else None
        async for payload in sse_stream_payloads(source, tap):
            if "error" in payload:
                yield sse_data(payload)
                continue
            if to_open is not None:
                for head in to_open.opening(response_id):
                    # No output: it does not hold the first text behind it (coalesce.py).
                    yield NoOutputEvent(sse_event(head, exclude_unset=True))
                to_open = None
            chunk = GenerateTokensStreamResponse.model_validate(payload)
            out = await feeder.feed(chunk)
            if not out.choices and out.usage is None:
                continue  # a step the parser held whole: vLLM writes nothing for it
            out.id = response_id
            written = event(out)
            yield written if carries_output(out) else NoOutputEvent(written)
        yield f"data: {DONE}\n\n"
