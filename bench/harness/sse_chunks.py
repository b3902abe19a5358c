"""The JSON chunks of one streamed POST, read in this process with httpx."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx


async def json_chunks(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]
) -> AsyncIterator[dict[str, Any]]:
    """Each ``data:`` chunk up to ``[DONE]``; a non-200 answer or an error event
    fails the caller (a benchmark's load must not count failures as work)."""
    async with client.stream("POST", path, json=body, headers=headers) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{reply.status_code}: {(await reply.aread())[:500]!r}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream failed: {chunk}")
            yield chunk
