"""OpenAI Responses output for a :class:`TextJob` (``/v1/responses``), in either placement.

vLLM builds a Responses answer from its engine's outputs: per step, the text the
engine's detokenizer made, the token ids and logprobs, in a ``RequestOutput``. The
graph's Generate sends token ids only, so this module rebuilds those outputs, each
chunk's text from the same stateful detokenization completions use (the engine's
rules, with the request's ``skip_special_tokens`` and stop strings), and hands them
to vLLM's own Responses generators (``vllm_adapter/responses.py``), which parse
reasoning and function calls and write the events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from http import HTTPStatus
from typing import Any

from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesResponse
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateLogProbs,
    GenerateTokensResponse,
    GenerateTokensStreamChoice,
    GenerateTokensStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import UsageInfo
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.renderers.online_derenderer import OnlineDerenderer

from deployments.messages.replies import Reply
from deployments.messages.tier import TextJob
from deployments.text.sse import responses_error_event, sse_stream_payloads
from deployments.text.stop_strings import ended_on_stop_token
from deployments.text.stream_derenderer import CompletionStreamDerenderer
from deployments.vllm_adapter.internals import resolve_logprobs
from deployments.vllm_adapter.responses import ResponsesConversion, StreamFailed


class ResponsesOutput:
    """Derenders one Responses job's generate output, unary or streamed."""

    def __init__(self, derenderer: OnlineDerenderer) -> None:
        self._derenderer = derenderer
        self._conversion = ResponsesConversion(derenderer)

    async def unary(self, job: TextJob, response: GenerateTokensResponse) -> Any:
        """The answer vLLM's server gives: the response as JSON, or the error value."""
        request = job.responses_request
        assert request is not None
        choice = response.choices[0]
        chunk = GenerateTokensStreamResponse(
            request_id=response.request_id,
            usage=response.usage,
            choices=[
                GenerateTokensStreamChoice(
                    index=choice.index,
                    finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                    token_ids=list(choice.token_ids or []),
                    logprobs=choice.logprobs,
                )
            ],
        )
        answer = await self._conversion.response(
            request,
            job.generate_request.sampling_params,
            job.model_name,
            self._conversion.context(request, job.generate_request.token_ids),
            self._outputs(job, _one(chunk), per_token=False),
        )
        if isinstance(answer, ResponsesResponse):
            return Reply(HTTPStatus.OK.value, answer.model_dump(mode="json", by_alias=True))
        return answer

    async def stream(self, job: TextJob, source: AsyncIterator[str]) -> AsyncGenerator[str, None]:
        """Generate SSE events in → Responses events out, as vLLM's server writes them;
        a failed generate stream ends it with Responses' ``error`` event."""
        request = job.responses_request
        assert request is not None
        events = self._conversion.events(
            request,
            job.generate_request.sampling_params,
            job.model_name,
            self._conversion.context(request, job.generate_request.token_ids),
            self._outputs(job, _chunks(source), per_token=True),
        )
        written = 0
        try:
            async for event in events:
                yield event
                written += 1
        except StreamFailed as failed:
            yield responses_error_event(failed.error, written)

    async def _outputs(
        self,
        job: TextJob,
        chunks: AsyncIterator[GenerateTokensStreamResponse],
        per_token: bool,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Each chunk as the ``RequestOutput`` (delta) vLLM's engine would have made: a
        stream's one per token (``per_token``, see ``_per_token``), a unary answer's one
        for all (vLLM's final-only output)."""
        prompt = job.generate_request.token_ids
        text = CompletionStreamDerenderer(
            self._derenderer, _text_request(job), prompt, job.model_name
        )
        include_stop = job.generate_request.sampling_params.include_stop_str_in_output
        context: list[int] = []  # sampled ids so far: logprob decoding's context
        async for whole in chunks:
            for chunk in _per_token(whole) if per_token else [whole]:
                yield await self._output(job, text, chunk, include_stop, context)

    async def _output(
        self,
        job: TextJob,
        text: CompletionStreamDerenderer,
        chunk: GenerateTokensStreamResponse,
        include_stop: bool,
        context: list[int],
    ) -> RequestOutput:
        """One token's ``RequestOutput`` (``context``: the sampled ids before it)."""
        prompt = job.generate_request.token_ids
        choice = chunk.choices[0]
        token_ids = list(choice.token_ids or [])
        derendered = await text.feed(_without_stop_token(chunk, include_stop))
        logprobs = None
        if choice.logprobs is not None:
            logprobs = self._sample_logprobs(choice.logprobs, context)
        context.extend(token_ids)
        return RequestOutput(
            request_id=job.generate_request.request_id,
            prompt=None,
            prompt_token_ids=prompt,
            prompt_logprobs=None,
            outputs=[
                CompletionOutput(
                    index=0,
                    text=derendered.choices[0].text if derendered.choices else "",
                    token_ids=token_ids,
                    cumulative_logprob=None,
                    logprobs=logprobs,
                    finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                )
            ],
            finished=choice.finish_reason is not None,
            num_cached_tokens=_cached_tokens(chunk.usage),
        )

    def _sample_logprobs(
        self, logprobs: GenerateLogProbs, context: list[int]
    ) -> list[dict[int, Logprob]]:
        """Generate's id logprobs as the engine's per-position dicts (the sampled token
        first, then its candidates in rank order), each with its decoded text."""
        tokenizer = self._derenderer.renderer.get_tokenizer()
        named = resolve_logprobs(logprobs, tokenizer, context).content or []
        positions = []
        for entry, text in zip(logprobs.content or [], named, strict=True):
            position = {entry.token_id: Logprob(entry.logprob, entry.rank, text.token)}
            for top, top_text in zip(entry.top_logprobs, text.top_logprobs, strict=True):
                position.setdefault(top.token_id, Logprob(top.logprob, top.rank, top_text.token))
            positions.append(position)
        return positions


def _text_request(job: TextJob) -> CompletionRequest:
    """A completion request that detokenizes as the engine would for this job's
    sampling params (special tokens, spacing, stop strings)."""
    params = job.generate_request.sampling_params
    return CompletionRequest(
        model=job.model_name,
        prompt=job.generate_request.token_ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
        stop=list(params.stop or []),
        include_stop_str_in_output=params.include_stop_str_in_output,
    )


def _without_stop_token(
    chunk: GenerateTokensStreamResponse, include_stop: bool
) -> GenerateTokensStreamResponse:
    """The chunk whose text to make: without the EOS or stop token that ended it, whose
    text the engine's detokenizer drops (a kept special token would show it)."""
    choice = chunk.choices[0]
    if not choice.token_ids or not ended_on_stop_token(
        choice.finish_reason, choice.stop_reason, include_stop
    ):
        return chunk
    shorter = choice.model_copy(update={"token_ids": choice.token_ids[:-1]})
    return chunk.model_copy(update={"choices": [shorter]})


def _cached_tokens(usage: UsageInfo | None) -> int | None:
    details = usage.prompt_tokens_details if usage is not None else None
    return details.cached_tokens if details is not None else None


def _per_token(chunk: GenerateTokensStreamResponse) -> list[GenerateTokensStreamResponse]:
    """The chunk as one chunk per token, as vLLM's engine hands its server its outputs
    (at its default stream interval): vLLM's Responses parser reads one delta per
    output, and what it makes of a delta, the logprobs it attaches included, depends
    on where deltas are cut (a ``</think>`` alone in a delta yields nothing, and its
    logprobs are dropped). The finish goes with the last token; a chunk without
    choices (usage) is skipped."""
    if not chunk.choices:
        return []
    choice = chunk.choices[0]
    token_ids = list(choice.token_ids or [])
    if len(token_ids) <= 1:
        return [chunk]
    content = choice.logprobs.content if choice.logprobs is not None else None
    parts = []
    for i, token in enumerate(token_ids):
        last = i == len(token_ids) - 1
        part = choice.model_copy(
            update={
                "token_ids": [token],
                "finish_reason": choice.finish_reason if last else None,
                "stop_reason": choice.stop_reason if last else None,
                "logprobs": None
                if content is None
                else GenerateLogProbs(content=content[i : i + 1]),
            }
        )
        parts.append(
            chunk.model_copy(update={"choices": [part], "usage": chunk.usage if last else None})
        )
    return parts


async def _one(
    chunk: GenerateTokensStreamResponse,
) -> AsyncGenerator[GenerateTokensStreamResponse, None]:
    yield chunk


async def _chunks(source: AsyncIterator[str]) -> AsyncGenerator[GenerateTokensStreamResponse, None]:
    """The generate stream's chunks; its error event ends the Responses stream."""
    async for payload in sse_stream_payloads(source):
        if "error" in payload:
            raise StreamFailed(payload["error"])
        yield GenerateTokensStreamResponse.model_validate(payload)
