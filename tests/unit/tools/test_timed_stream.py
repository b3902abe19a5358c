"""The benches' stream client (``bench.harness.timed_stream``): its byte search reads
each event as a JSON reading would, and its HTTP reader takes streams however the
wire splits them."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bench.harness.timed_stream import StreamTimer, TimedStream, timed_chat

TEXT_FIELDS = ("content", "reasoning", "tool_calls")


def _chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice], **extra}


EVENTS: list[dict[str, Any]] = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": None, "reasoning": None}),
    _chunk({"reasoning": "think"}),
    _chunk({"reasoning": ""}),
    _chunk({"content": "hi"}),
    _chunk({"content": '{"content":"x", "reasoning": "y"}'}),  # keys inside a string
    _chunk({"content": 'a, "tool_calls": [{"id": 1}]'}),
    _chunk({"reasoning_content": "not vLLM's key"}),
    _chunk({"tool_calls": []}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
    _chunk({}, usage=None),
    _chunk({"content": ""}, usage={"prompt_tokens": 3, "completion_tokens": 7}),
    {
        "id": "chatcmpl-1",
        "choices": [
            {"index": 0, "delta": {}, "logprobs": {"content": [{"token": "a"}]}},
        ],
    },
    {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}},
]


def _json_reading(event: dict[str, Any]) -> tuple[bool, int | None]:
    """What the JSON reading the client replaced finds: text, and the usage's tokens."""
    deltas = [c.get("delta") or {} for c in event.get("choices") or ()]
    text = any(d.get(f) for d in deltas for f in TEXT_FIELDS)
    usage = event.get("usage")
    return text, usage["completion_tokens"] if usage else None


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")], ids=["compact", "spaced"])
@pytest.mark.parametrize("event", EVENTS, ids=range(len(EVENTS)))
def test_an_event_reads_as_its_json_reads(
    event: dict[str, Any], separators: tuple[str, str]
) -> None:
    timer = StreamTimer(started=0.0)
    timer.event(json.dumps(event, separators=separators).encode(), now=1.0)
    text, tokens = _json_reading(event)
    assert (timer.first == 1.0, timer.last == 1.0) == (text, text)
    assert timer.tokens == (tokens or 0)
    assert timer.error is None and not timer.over


def test_a_stream_keeps_its_first_and_last_text_and_ends_at_done() -> None:
    timer = StreamTimer(started=0.0)
    for now, event in enumerate(EVENTS, start=1):
        timer.event(json.dumps(event).encode(), now=float(now))
    timer.event(b"[DONE]", now=99.0)
    result = timer.result(200, "tier", None)
    assert (result.first, result.last, result.ended) == (3.0, 10.0, 99.0)
    assert result.tokens == 9 and result.ok and result.placed == "tier"


def test_an_error_event_ends_the_stream_as_failed() -> None:
    timer = StreamTimer(started=0.0)
    timer.event(b'{"error": {"message": "engine died", "code": 500}}', now=1.0)
    assert timer.over
    result = timer.result(200, None, None)
    assert not result.ok and result.error is not None and "engine died" in result.error


Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _against(answer: Answer, headers: dict[str, str] | None = None) -> TimedStream:
    """A streamed chat against a local HTTP server whose answer ``answer`` writes."""

    async def scenario() -> TimedStream:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            assert json.loads(await reader.readexactly(length)) == {"stream": True}
            await answer(writer)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            return await timed_chat(url, {"stream": True}, headers)
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(scenario())


def _sse(*payloads: str) -> bytes:
    return b"".join(f"data: {p}\n\n".encode() for p in payloads)


STREAM = _sse(
    json.dumps(_chunk({"role": "assistant", "content": ""})),
    json.dumps(_chunk({"reasoning": "a"})),
    json.dumps(_chunk({"content": "b"})),
    json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}),
    "[DONE]",
)


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def _dribble(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Byte by byte, each its own write: every split the wire can make."""
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        await writer.drain()


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_a_stream_split_anywhere_reads_whole(chunked: bool) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Text-Placement: inline\r\n"
    body = _chunked(STREAM, 37) if chunked else STREAM
    framing = b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Connection: close\r\n\r\n"

    async def answer(writer: asyncio.StreamWriter) -> None:
        await _dribble(writer, head + framing + body)

    result = _against(answer, {"X-Test": "1"})
    assert result.ok, result.error
    assert result.tokens == 2 and result.placed == "inline"
    assert result.first is not None and result.last is not None and result.ended is not None
    assert result.started <= result.first <= result.last <= result.ended


def test_a_refusal_keeps_its_status_and_body() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        body = b'{"error": {"message": "bad", "code": 400}}'
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()

    result = _against(answer)
    assert not result.ok
    assert result.error is not None and result.error.startswith("400: ") and "bad" in result.error


def test_a_stream_cut_before_done_fails() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(_chunked(STREAM[: STREAM.index(b"data: [DONE]")], 64)[: -len(b"0\r\n\r\n")])
        await writer.drain()

    result = _against(answer)
    assert not result.ok and result.error == "ended without [DONE]"
    assert result.first is not None and result.tokens == 2


def test_a_refused_connection_is_a_failed_stream() -> None:
    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = asyncio.run(timed_chat(f"http://127.0.0.1:{port}/", {"stream": True}))
    assert not result.ok and result.error is not None
    assert result.error.startswith("ConnectionRefusedError")
