"""``/inference/v1/generate`` with ``output_mode: "derender"``: the chat output the
Derender tier makes for the tokens, in the shape vLLM's scale-out protocol gives it."""

from __future__ import annotations

import time
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
)

from deployments.messages.tier import (
    DerenderChoice,
    DerenderStreamChoice,
    GenerateDerenderResponse,
    GenerateDerenderStreamResponse,
)
from deployments.text.sse import sse_event


def derender_response(response: ChatCompletionResponse) -> GenerateDerenderResponse:
    """A chat answer as the ``derender`` output mode answers it."""
    return GenerateDerenderResponse(
        request_id=response.id,
        created=response.created,
        model=response.model,
        choices=[
            DerenderChoice(
                index=c.index,
                message=c.message,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                token_ids=c.token_ids,
                logprobs=c.logprobs,
            )
            for c in response.choices
        ],
        usage=response.usage,
    )


def derender_event(chunk: Any) -> str:
    """A chat chunk as the same step of a ``derender`` stream, written once."""
    assert isinstance(chunk, ChatCompletionStreamResponse)
    return sse_event(
        GenerateDerenderStreamResponse(
            request_id=chunk.id,
            created=chunk.created or int(time.time()),
            model=chunk.model,
            choices=[
                DerenderStreamChoice(
                    index=c.index,
                    delta=c.delta,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    token_ids=c.token_ids,
                    logprobs=c.logprobs,
                )
                for c in chunk.choices
            ],
            usage=chunk.usage,
        )
    )
