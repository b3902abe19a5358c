"""SSE events read back as vLLM writes them, whatever the text inside."""

from __future__ import annotations

from pydantic import BaseModel
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionStreamResponse
from vllm.entrypoints.serve.engine.protocol import UsageInfo

from deployments.text.output import openai_event
from deployments.text.sse import DONE, sse_data, sse_event, sse_payloads

# Line separators that are not SSE line ends; JSON escapes control characters but
# pydantic and json.dumps(ensure_ascii=False) leave these raw inside strings.
NOT_LINE_ENDS = "a\u2028b\u2029c\x85d"


class Chunk(BaseModel):
    text: str


def test_text_with_unicode_line_separators_is_one_event() -> None:
    joined = sse_event(Chunk(text=NOT_LINE_ENDS)) + sse_data({"text": NOT_LINE_ENDS})
    assert NOT_LINE_ENDS in joined, "written unescaped, as the bug needs"
    payloads = list(sse_payloads(joined + f"data: {DONE}\n\n"))
    assert payloads == [{"text": NOT_LINE_ENDS}, {"text": NOT_LINE_ENDS}, DONE]


def test_sse_line_ends_and_comments() -> None:
    text = 'data: {"a": 1}\r\n\r\n: comment\rdata:{"b": 2}\n\ndata: [DONE]\n\n'
    assert list(sse_payloads(text)) == [{"a": 1}, {"b": 2}, DONE]


def test_the_final_usage_chunk_is_written_without_nulls_as_vllm_writes_it() -> None:
    """vLLM dumps its last chunk (usage, no choices) with ``exclude_none``; the
    others keep their null fields."""
    usage = UsageInfo(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    final = ChatCompletionStreamResponse(id="c", model="m", choices=[], usage=usage)
    payload = next(iter(sse_payloads(openai_event(final))))
    assert isinstance(payload, dict)
    assert payload["usage"] == {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
    assert None not in payload.values()
    step = ChatCompletionStreamResponse(id="c", model="m", choices=[])
    payload = next(iter(sse_payloads(openai_event(step))))
    assert isinstance(payload, dict) and payload["usage"] is None
