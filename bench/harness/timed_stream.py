"""One streamed chat, timed by its text chunks: what TTFT and TPOT are read from.

The client shares its host's cores with the server it measures (``bench.offload``
puts it beside the CPU tier, ``bench.scaling`` beside everything), so it reads each
stream with asyncio's own protocol and a byte search per event rather than httpx and
a JSON parse per chunk: with 64 streams of a paced engine httpx's reader took about
0.14 ms of CPU per token, as much as the Ingress and Serve's head together, on the
very core whose headroom the experiment measures. Only the events that decide
something are parsed: the usage chunk, an error.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# A delta with text: an answer, reasoning or a tool call (what a JSON reading of
# ``choices[*].delta`` finds truthy in ``content``, ``reasoning`` or ``tool_calls``).
# A key is a quoted name preceded by ``{`` or ``,``: the same name inside a string
# value has its quotes escaped and cannot match.
_TEXT = re.compile(
    rb'[{,]\s*"(?:content|reasoning)"\s*:\s*"(?!")|[{,]\s*"tool_calls"\s*:\s*\[\s*[^\s\]]'
)
_USAGE = re.compile(rb'[{,]\s*"usage"\s*:\s*\{')
_ERROR = re.compile(rb'[{,]\s*"error"\s*:')


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


class StreamTimer:
    """Times a chat stream from its SSE events (each ``data: …`` payload as bytes)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.last: float | None = None
        self.ended: float | None = None
        self.tokens = 0
        self.error: str | None = None

    @property
    def over(self) -> bool:
        return self.ended is not None or self.error is not None

    def event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.ended = now
            return
        if _ERROR.search(data):
            payload = json.loads(data)
            if "error" in payload:
                self.error = f"error event: {str(payload['error'])[:300]}"
                return
        if _USAGE.search(data):
            usage = json.loads(data).get("usage")
            if usage:
                self.tokens = usage["completion_tokens"]
        if _TEXT.search(data):
            self.last = now
            self.first = self.first or now

    def result(self, status: int | None, placed: str | None, failure: str | None) -> TimedStream:
        ok = status == 200 and self.ended is not None and self.error is None and not failure
        error = failure or self.error
        if error is None and not ok:
            error = "ended without [DONE]"
        return TimedStream(
            self.started, self.first, self.last, self.ended, self.tokens, ok, error, placed
        )


class _ChatReader(asyncio.Protocol):
    """One HTTP/1.1 POST and its streamed answer (chunked or not), events to a timer."""

    def __init__(self, request: bytes, timer: StreamTimer) -> None:
        self._request = request
        self.timer = timer
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status: int | None = None
        self.placed: str | None = None
        self.failure: str | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._raw = bytearray()  # bytes not yet taken from the wire framing
        self._events = bytearray()  # the body, not yet split into events
        self._chunked = False
        self._body: list[bytes] | None = None  # a non-200's body, kept for the error

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self._raw += data
        if self.status is None and not self._head():
            return
        if self._chunked:
            self._unchunk()
        else:
            self._take(bytes(self._raw))
            self._raw.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._body is not None:
            self.failure = f"{self.status}: {b''.join(self._body)[:300]!r}"
        elif not self.timer.over and self.failure is None:
            self.failure = f"connection lost: {exc!r}" if exc else None
        if not self.done.done():
            self.done.set_result(None)

    def _head(self) -> bool:
        end = self._raw.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self._raw[:end]).decode("latin-1").split("\r\n")
        del self._raw[: end + 4]
        self.status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.placed = headers.get("x-text-placement")
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if self.status != 200:
            self._body = []
        return True

    def _unchunk(self) -> None:
        while True:
            line_end = self._raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(bytes(self._raw[:line_end]).split(b";")[0], 16)
            if size == 0:
                self._finish()
                return
            if len(self._raw) < line_end + 2 + size + 2:
                return
            self._take(bytes(self._raw[line_end + 2 : line_end + 2 + size]))
            del self._raw[: line_end + 2 + size + 2]

    def _take(self, body: bytes) -> None:
        if self._body is not None:
            self._body.append(body)
            return
        self._events += body
        now = time.monotonic()
        start = 0
        while (end := self._events.find(b"\n\n", start)) >= 0:
            event = bytes(self._events[start:end])
            start = end + 2
            if event.startswith(b"data: "):
                self.timer.event(event[6:], now)
                if self.timer.over:
                    self._finish()
                    return
        del self._events[:start]

    def _finish(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection now (the call timed out)."""
        if self._transport is not None:
            self._transport.abort()  # type: ignore[attr-defined]


async def timed_chat(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout_s: float = 600
) -> TimedStream:
    """POST ``body`` to ``url`` (plain HTTP) and time the chat stream it answers."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + payload
    timer = StreamTimer(time.monotonic())
    loop = asyncio.get_running_loop()
    reader: _ChatReader | None = None
    try:
        async with asyncio.timeout(timeout_s):
            _, protocol = await loop.create_connection(
                lambda: _ChatReader(request, timer), parts.hostname or "127.0.0.1", parts.port or 80
            )
            reader = protocol
            await reader.done
    except (OSError, TimeoutError) as e:
        failure = f"{type(e).__name__}: {e}"
        if reader is not None:
            reader.abort()
        status = None if reader is None else reader.status
        placed = None if reader is None else reader.placed
        return timer.result(status, placed, failure)
    return timer.result(reader.status, reader.placed, reader.failure)
