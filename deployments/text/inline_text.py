"""The inline text placement: a job's OpenAI output made next to the engine.

Generate serves it: it opens the engine call (``serve``, one engine request per
call, inside ``opening``) and owns the call's lifetime; this is what happens
between the job and its items. A stream that can move goes out as ``TextSteps``
and one that moved here goes on from its steps (``inline_move.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateRequest,
    GenerateResponseBase,
    GenerateTokensResponse,
)

from deployments.messages.text_steps import TextResume
from deployments.messages.tier import TextJob
from deployments.text.inline_move import StepLog, inline_movable
from deployments.text.output import TextOutput, tokens_request
from deployments.transport.concurrently import all_or_none
from deployments.transport.migration import continuation

# Starts one engine request; its result is vLLM's (an error, a unary response, or
# the stream's SSE events).
Serve = Callable[[GenerateRequest], Awaitable[Any]]


def inline_call_movable(job: TextJob) -> bool:
    """Whether an inline call can be made again elsewhere once it started: a unary one
    (it delivered nothing), a stream whose derenderer can be rebuilt (``inline_movable``);
    a multi-prompt completion cannot."""
    return job.batch is None and (not job.generate_request.stream or inline_movable(job))


class InlineText:
    """Derenders a job's engine output next to the engine."""

    def __init__(self, text: TextOutput) -> None:
        self._text = text

    async def items(
        self,
        job: TextJob,
        resume: TextResume | None,
        serve: Serve,
        opening: Callable[[], AbstractContextManager[Any]],
    ) -> AsyncGenerator[Any, None]:
        """The job's items for the Ingress (a step channel batches a stream's events
        with every other stream's it carries); ``resume``: where a moved stream goes on."""
        if job.batch is not None:
            # Every prompt on this engine at once, as vLLM's server runs a batch.
            stream = bool(job.generate_request.stream)
            with opening():
                results = await all_or_none(
                    serve(tokens_request(job, stream=stream, prompt=p)) for p in job.batch
                )
            items = self._text.respond_batch(job, results)
        else:
            items = await self._single(job, resume, serve, opening)
        # Closed with this generator, not left to the collector: the engine's streams
        # close with it.
        async with contextlib.aclosing(items) as answered:
            async for item in answered:
                yield item

    async def _single(
        self,
        job: TextJob,
        resume: TextResume | None,
        serve: Serve,
        opening: Callable[[], AbstractContextManager[Any]],
    ) -> AsyncGenerator[Any, None]:
        """The items of a one-prompt job, once its engine request started."""
        stream = bool(job.generate_request.stream)
        # Tokens are asked for (tokens_request): a unary result is a tokens response.
        request = tokens_request(job, stream=stream)
        if resume is not None:
            # Not None: a stream that moved had tokens left (DeliveredText).
            resumed = continuation(request, resume.token_ids)
            assert resumed is not None
            request = resumed
        with opening():
            result = await serve(request)
        assert not isinstance(result, GenerateResponseBase) or isinstance(
            result, GenerateTokensResponse
        )
        if not (stream and inline_movable(job) and isinstance(result, AsyncIterator)):
            return self._text.respond(job, result)
        steps = StepLog(resume)
        if resume is not None:
            prompt_tokens = len(job.generate_request.token_ids)
            result = steps.replayed(result, request.request_id, prompt_tokens)
        events = self._text.respond(job, result, tap=steps.saw)
        return steps.tagged(events)
