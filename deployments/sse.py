"""Server-sent events, in the bytes shape vLLM's servers write."""

from __future__ import annotations

from pydantic import BaseModel

DONE = "[DONE]"


def sse_event(model: BaseModel) -> str:
    """One ``data:`` event, dumped as vLLM's OpenAI stream generators dump chunks."""
    return f"data: {model.model_dump_json()}\n\n"
