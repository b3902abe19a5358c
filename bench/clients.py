"""One client per topology, each calling the graph as a user of that topology would.

Render is part of every client, as in the seed, so the columns differ only in
where token → text happens:

- G: render + ``/inference/v1/generate`` (``tokens``), the client keeps tokens;
- T: the same with ``output_mode: "text"`` (inline detokenization);
- B / BP: tokens, then one ``/v1/chat/completions/derender`` call per generate
  chunk, carrying ``stream_state`` (vLLM's stateless per-chunk protocol);
- S: ``/v1/chat/completions`` on the tier placement (stateful derender tier);
- I: the same on the inline placement.

A "delta" is a chunk that reaches the client carrying output (token ids,
text, reasoning or a tool call); the output token count is the engine's
``usage.completion_tokens``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from bench.shapes import BenchRequest
from bench.stats import RequestRecord

Clock = Callable[[], float]
Client = Callable[[httpx.AsyncClient, BenchRequest, RequestRecord, Clock], Awaitable[None]]
USAGE = {"include_usage": True}


class RequestFailed(Exception):
    """The server answered with an error status or an error event."""


async def sse_payloads(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """JSON payloads of an SSE response up to ``[DONE]``; an error event raises."""
    if response.status_code != 200:
        await response.aread()
        raise RequestFailed(f"HTTP {response.status_code}: {response.text[:200]}")
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if "error" in payload:
            raise RequestFailed(f"error event: {payload['error'].get('message')}")
        yield payload


async def render(http: httpx.AsyncClient, request: BenchRequest) -> dict[str, Any]:
    response = await http.post("/v1/chat/completions/render", json=request.body)
    if response.status_code != 200:
        raise RequestFailed(f"render HTTP {response.status_code}: {response.text[:200]}")
    rendered: dict[str, Any] = response.json()
    # parse_context is for output_mode "derender"; these clients stream tokens or text.
    rendered.pop("parse_context", None)
    return rendered


def usage_tokens(payload: dict[str, Any]) -> int | None:
    usage = payload.get("usage")
    return int(usage["completion_tokens"]) if usage else None


def carries_output(choice: dict[str, Any]) -> bool:
    """Whether one streamed choice (generate or chat chunk) carries output."""
    if choice.get("token_ids") or choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return bool(
        delta.get("content")
        or delta.get("reasoning")
        or delta.get("reasoning_content")
        or delta.get("tool_calls")
    )


def note_chunk(payload: dict[str, Any], record: RequestRecord, clock: Clock) -> None:
    if record.first_chunk_s is None:
        record.first_chunk_s = clock()
    if any(carries_output(c) for c in payload.get("choices") or []):
        record.delta_s.append(clock())
    tokens = usage_tokens(payload)
    if tokens is not None:
        record.output_tokens = tokens


def generate_client(output_mode: str) -> Client:
    async def run(
        http: httpx.AsyncClient, request: BenchRequest, record: RequestRecord, clock: Clock
    ) -> None:
        rendered = await render(http, request)
        body = {**rendered, "stream": True, "stream_options": USAGE, "output_mode": output_mode}
        async with http.stream("POST", "/inference/v1/generate", json=body) as response:
            async for payload in sse_payloads(response):
                note_chunk(payload, record, clock)

    return run


async def per_chunk_derender(
    http: httpx.AsyncClient, request: BenchRequest, record: RequestRecord, clock: Clock
) -> None:
    """vLLM's way: the client threads ``stream_state`` through one call per chunk."""
    rendered = await render(http, request)
    body = {**rendered, "stream": True, "stream_options": USAGE}
    state = None
    async with http.stream("POST", "/inference/v1/generate", json=body) as response:
        async for chunk in sse_payloads(response):
            tokens = usage_tokens(chunk)
            if tokens is not None:
                record.output_tokens = tokens
            step = await http.post(
                "/v1/chat/completions/derender",
                json={
                    "stream": True,
                    "generate_chunk": chunk,
                    "stream_state": state,
                    "chat_request": request.body,
                    "prompt_token_ids": rendered["token_ids"],
                },
            )
            if step.status_code != 200:
                raise RequestFailed(f"derender HTTP {step.status_code}: {step.text[:200]}")
            answer = step.json()
            state = answer["stream_state"]
            if answer.get("chunk"):
                note_chunk({"choices": answer["chunk"].get("choices")}, record, clock)


def chat_client(placement: str) -> Client:
    async def run(
        http: httpx.AsyncClient, request: BenchRequest, record: RequestRecord, clock: Clock
    ) -> None:
        body = {**request.body, "stream": True, "stream_options": USAGE}
        headers = {"X-Text-Placement": placement}
        async with http.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers
        ) as response:
            async for payload in sse_payloads(response):
                note_chunk(payload, record, clock)

    return run


CLIENTS: dict[str, Client] = {
    "G": generate_client("tokens"),
    "T": generate_client("text"),
    "B": per_chunk_derender,
    "BP": per_chunk_derender,
    "S": chat_client("tier"),
    "I": chat_client("inline"),
}


async def issue(
    client: Client,
    http: httpx.AsyncClient,
    request: BenchRequest,
    record: RequestRecord,
    clock: Clock,
) -> None:
    """Run one request to its end; any failure is recorded, never raised."""
    record.sent_s = clock()
    try:
        await client(http, request, record, clock)
    except RequestFailed as exc:
        record.error = str(exc)
    except Exception as exc:  # transport errors, malformed answers: the request failed
        record.error = f"{type(exc).__name__}: {exc}"
    else:
        record.done_s = clock()


def monotonic_clock(start: float) -> Clock:
    return lambda: time.monotonic() - start
