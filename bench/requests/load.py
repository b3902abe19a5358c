"""The load: short streamed chats in a closed loop, as a chat front end sends them.

``concurrency`` clients each send one request, read its stream to ``[DONE]``,
and send the next, until ``requests`` have been sent. Every chat asks for
``tokens`` tokens at temperature 0 with ``ignore_eos`` (so every server makes
the same answer of the same length) and reports usage in its last chunk.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.harness.sse_chunks import json_chunks

PROMPTS = [
    "What is the capital of Japan?",
    "think: what is 2 plus 3?",
    "What is the weather in Paris?",
    "hello",
]
_TEXT_KEYS = ("content", "reasoning", "reasoning_content", "tool_calls")


@dataclass
class Timing:
    ttft_s: float
    """To the first chunk that carries output (vLLM's role-only chunk does not)."""
    e2e_s: float


@dataclass
class ShortChats:
    model: str
    tokens: int = 8

    def body(self, i: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": self.tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def carries_output(chunk: dict[str, Any]) -> bool:
    return any(
        (choice.get("delta") or {}).get(key) for choice in chunk["choices"] for key in _TEXT_KEYS
    )


async def one_chat(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], tokens: int
) -> Timing:
    """One streamed chat, timed; any error or a short answer fails the run."""
    sent = time.perf_counter()
    first: float | None = None
    used = None
    async for chunk in json_chunks(client, "/v1/chat/completions", body, headers):
        if first is None and carries_output(chunk):
            first = time.perf_counter()
        if chunk.get("usage"):
            used = chunk["usage"]["completion_tokens"]
    done = time.perf_counter()
    if used != tokens:
        raise RuntimeError(f"the answer had {used} tokens, not {tokens}")
    return Timing((first or done) - sent, done - sent)


async def closed_loop(
    base_url: str, load: ShortChats, concurrency: int, requests: int, headers: dict[str, str]
) -> tuple[list[Timing], float]:
    """``requests`` chats from ``concurrency`` clients; their timings and the wall time."""
    numbers = itertools.count()
    timings: list[Timing] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while (i := next(numbers)) < requests:
            timings.append(await one_chat(client, load.body(i), headers, load.tokens))

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return timings, wall
