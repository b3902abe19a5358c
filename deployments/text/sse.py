"""Server-sent events, in the bytes shape vLLM's servers write."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from pydantic import BaseModel

DONE = "[DONE]"
# The SSE line ends, and only those: ``str.splitlines`` also splits on U+2028,
# U+2029, U+0085 and others, which pydantic writes unescaped inside JSON strings.
_LINE_END = re.compile(r"\r\n|\r|\n")


def sse_event(model: BaseModel, *, exclude_none: bool = False, exclude_unset: bool = False) -> str:
    """One ``data:`` event, dumped as vLLM's OpenAI stream generators dump chunks
    (its final usage chunk with ``exclude_none``, its chat role chunk with
    ``exclude_unset``)."""
    dumped = model.model_dump_json(exclude_none=exclude_none, exclude_unset=exclude_unset)
    return f"data: {dumped}\n\n"


def sse_data(payload: dict[str, Any] | str) -> str:
    """One ``data:`` event for a payload read back by :func:`sse_payloads`."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n"
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


# Sees each payload of a stream as it is read (``text/step_log.py``).
PayloadTap = Callable[[dict[str, Any]], None]


async def sse_stream_payloads(
    source: AsyncIterator[str], tap: PayloadTap | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a stream of (possibly joined) events, up to ``[DONE]``,
    each shown to ``tap`` first."""
    async for text in source:
        for payload in sse_payloads(text):
            if payload == DONE:
                return
            assert isinstance(payload, dict)
            if tap is not None:
                tap(payload)
            yield payload


def sse_payloads(text: str) -> Iterator[dict[str, Any] | str]:
    """Each ``data: …`` event in ``text`` (one event, or several joined) → its
    JSON object, or ``DONE``. Comments and blank lines are skipped."""
    for line in _LINE_END.split(text):
        if line.startswith("data:"):
            data = line[len("data:") :].removeprefix(" ")
            yield DONE if data == DONE else json.loads(data)


def responses_error_event(error: dict[str, Any], sequence_number: int | None = None) -> str:
    """A failed Responses stream's last event: Responses' ``error`` event, carrying the
    error vLLM's OpenAI routes would send (its type as ``code``); ``sequence_number``
    where the writer knows how many events came before."""
    event: dict[str, Any] = {
        "type": "error",
        "code": error.get("type"),
        "message": error.get("message", ""),
        "param": error.get("param"),
    }
    if sequence_number is not None:
        event["sequence_number"] = sequence_number
    return f"event: error\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"
