"""OpenAI text output for a :class:`TextJob`, from a source of generate output.

Both placements run this same code: inline, the source is the engine in the
same Generate replica; tier, the source is a streamed DeploymentHandle call to
Generate. Streams go through the stateful stream derenderer; unary responses
through vLLM's own batch derender (``ServingDerender``), exactly as its
``/v1/chat/completions/derender`` computes them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse
from vllm.entrypoints.openai.completion.protocol import CompletionResponse
from vllm.entrypoints.scale_out.derender.serving import ServingDerender
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderChatRequest,
    DerenderCompletionRequest,
    GenerateRequest,
    GenerateTokensResponse,
    GenerateTokensStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.renderers.online_derenderer import OnlineDerenderer

from .protocol import TextJob
from .sse import DONE, sse_event
from .stream_derenderer import ChatStreamDerenderer, CompletionStreamDerenderer


def tokens_request(job: TextJob, *, stream: bool) -> GenerateRequest:
    """The job's generate request, asking for tokens (we detokenize)."""
    return job.generate_request.model_copy(update={"output_mode": "tokens", "stream": stream})


class TextOutput:
    """Derenders one job's generate output into OpenAI responses."""

    def __init__(self, derenderer: OnlineDerenderer, serving_derender: ServingDerender) -> None:
        self._derenderer = derenderer
        self._serving = serving_derender

    async def unary(
        self, job: TextJob, response: GenerateTokensResponse
    ) -> ChatCompletionResponse | CompletionResponse | ErrorResponse:
        prompt = job.generate_request.token_ids
        response = response.model_copy(update={"request_id": job.generate_request.request_id})
        if job.chat_request is not None:
            return await self._serving.derender_chat_response(
                DerenderChatRequest(
                    model=job.model_name,
                    generate_response=response,
                    prompt_tokens=len(prompt),
                    prompt_token_ids=prompt,
                    chat_request=job.chat_request,
                )
            )
        return await self._serving.derender_completion_response(
            DerenderCompletionRequest(
                model=job.model_name,
                generate_responses=[response],
                prompt_tokens=[len(prompt)],
                prompt_token_ids=[prompt],
                completion_request=job.completion_request,
            )
        )

    async def stream(self, job: TextJob, source: AsyncIterator[str]) -> AsyncIterator[str]:
        """Generate SSE events in → OpenAI SSE events out, ending in ``[DONE]``.

        Error events from generate pass through unchanged; vLLM sends them as
        ``data: {"error": …}`` followed by ``[DONE]``.
        """
        prompt = job.generate_request.token_ids
        feeder: ChatStreamDerenderer | CompletionStreamDerenderer
        if job.chat_request is not None:
            feeder = ChatStreamDerenderer(
                self._derenderer, job.chat_request, prompt, job.model_name
            )
        else:
            assert job.completion_request is not None
            feeder = CompletionStreamDerenderer(
                self._derenderer, job.completion_request, prompt, job.model_name
            )
        response_id = job.generate_request.request_id
        async for event in source:
            payload = parse_sse(event)
            if payload is None:
                continue
            if payload is DONE:
                break
            if "error" in payload:
                yield event
                continue
            chunk = GenerateTokensStreamResponse.model_validate(payload)
            out = await feeder.feed(chunk)
            out.id = response_id
            yield sse_event(out)
        yield f"data: {DONE}\n\n"


def parse_sse(event: str) -> dict[str, Any] | str | None:
    """One ``data: …`` event → its JSON object, or ``DONE``; None for comments."""
    for line in event.splitlines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            return DONE if data == DONE else json.loads(data)
    return None
