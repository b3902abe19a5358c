"""Clients that give up on their requests while the engines run them: each closes its
connection under a request it sent, as a client with a timeout does."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from bench.metrics import running_requests


def running(base_url: str) -> dict[str, int]:
    """Requests each Generate replica's engine holds (the graph's ``/metrics``)."""
    return running_requests(httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=30).text)


def leave_once_running(
    base_url: str,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    *,
    clients: int,
    engine_requests: int,
    within_s: float = 30.0,
) -> None:
    """Send ``clients`` copies of a request, wait until the engines run
    ``engine_requests`` requests in all (failing if one is answered first), then close
    every connection."""

    async def leave() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
            calls = [
                asyncio.create_task(c.post(path, json=body, headers=headers))
                for _ in range(clients)
            ]
            deadline = time.monotonic() + within_s
            while sum(running_requests((await c.get("/metrics")).text).values()) < (
                engine_requests
            ):
                assert time.monotonic() < deadline, "the requests never all reached the engines"
                answered = [t.result() for t in calls if t.done()]
                assert not answered, [(r.status_code, r.text[:200]) for r in answered]
                await asyncio.sleep(0.1)
            for call in calls:  # each client leaves: its connection closes under it
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)

    asyncio.run(leave())


def wait_idle(base_url: str, within_s: float) -> float:
    """Seconds until every engine reports 0 requests; fails after ``within_s``."""
    start = time.monotonic()
    while True:
        counts = running(base_url)
        if counts and not any(counts.values()):
            return time.monotonic() - start
        if time.monotonic() - start > within_s:
            raise AssertionError(f"engines still running after {within_s}s: {counts}")
        time.sleep(0.05)
