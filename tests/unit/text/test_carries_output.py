"""Which stream chunks carry output: the rest leave without starting a coalescing window."""

from __future__ import annotations

from typing import Any

import pytest
from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import UsageInfo

from deployments.text.output import carries_output


def _chat(usage: UsageInfo | None = None, finish: str | None = None, **delta: Any) -> Any:
    choice = ChatCompletionResponseStreamChoice(
        index=0, delta=DeltaMessage(**delta), finish_reason=finish
    )
    return ChatCompletionStreamResponse(model="m", choices=[choice], usage=usage)


def _completion(text: str) -> Any:
    choice = CompletionResponseStreamChoice(index=0, text=text)
    return CompletionStreamResponse(model="m", choices=[choice])


@pytest.mark.parametrize(
    ("chunk", "carries"),
    [
        (_chat(role="assistant", content=""), False),  # the role chunk vLLM opens with
        (_chat(), False),  # an engine output whose text a parser holds back
        (_chat(content="The"), True),
        (_chat(reasoning="\n"), True),
        (_chat(finish="stop"), True),
        (_chat(usage=UsageInfo(prompt_tokens=3, total_tokens=3)), True),
        (_completion(""), False),
        (_completion("x"), True),
    ],
)
def test_a_chunk_carries_output_when_a_client_sees_something_in_it(
    chunk: Any, carries: bool
) -> None:
    assert carries_output(chunk) is carries
