"""One streamed chat, timed by its text chunks: what TTFT and TPOT are read from."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

TEXT_FIELDS = ("content", "reasoning", "tool_calls")


@dataclass(frozen=True)
class TimedStream:
    started: float
    """``time.monotonic()`` as the request was sent."""
    first: float | None
    """When the first chunk with text (answer, reasoning or a tool call) came."""
    last: float | None
    """When the last chunk with text came."""
    ended: float | None
    """When ``[DONE]`` came."""
    tokens: int
    """Completion tokens, from the usage chunk."""
    ok: bool
    """A 200 that ended with ``[DONE]`` and no error event."""
    error: str | None = None
    """Why not: the status and body, the error event, or the transport's error."""
    placed: str | None = None
    """Where the graph made its text (its ``X-Text-Placement`` answer)."""

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.started) * 1000

    @property
    def tpot_ms(self) -> float | None:
        """From the first text chunk to the stream's end, per token after the first, as
        vLLM's serving benchmark reads it ((latency − TTFT) / (tokens − 1)): text a
        parser holds back (a tool call's arguments, say) counts when the stream ends."""
        if not self.ok or self.first is None or self.ended is None or self.tokens < 2:
            return None
        return (self.ended - self.first) / (self.tokens - 1) * 1000

    @property
    def text_tpot_ms(self) -> float | None:
        """From the first text chunk to the last, per token after the first."""
        if not self.ok or self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1) * 1000


async def timed_chat(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> TimedStream:
    started = time.monotonic()
    first = last = ended = None
    tokens = 0
    ok = False
    error = placed = None
    try:
        async with http.stream("POST", url, json=body, headers=headers or {}) as reply:
            placed = reply.headers.get("X-Text-Placement")
            if reply.status_code != 200:
                error = f"{reply.status_code}: {(await reply.aread())[:300]!r}"
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    ok = reply.status_code == 200
                    ended = time.monotonic()
                    break
                payload = json.loads(data)
                if "error" in payload:
                    error = f"error event: {str(payload['error'])[:300]}"
                    break
                if payload.get("usage"):
                    tokens = payload["usage"]["completion_tokens"]
                deltas = [c.get("delta") or {} for c in payload.get("choices") or ()]
                if any(d.get(f) for d in deltas for f in TEXT_FIELDS):
                    last = time.monotonic()
                    first = first or last
    except httpx.HTTPError as e:
        ok, error = False, f"{type(e).__name__}: {e}"
    if not ok and error is None:
        error = "ended without [DONE]"
    return TimedStream(started, first, last, ended, tokens, ok, error, placed)
