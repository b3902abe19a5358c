"""Run one cell open-loop: issue on schedule, then drain or give up.

Requests go out at their arrival times whatever the earlier ones are doing.
After the last arrival the cell has a drain budget; requests still running
when it ends are cancelled (the client disconnects, so the graph frees their
engine slots) and the cell is reported as "did not drain", as the seed did.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from bench.clients import Client, issue, monotonic_clock
from bench.metrics import engine_busy
from bench.shapes import BenchRequest
from bench.stats import RequestRecord

NOT_DRAINED = "not drained: cancelled at the end of the drain budget"


@dataclass
class CellResult:
    records: list[RequestRecord]
    drained: bool
    wall_s: float
    started_at: float
    """``time.monotonic()`` at the cell's start."""


async def run_cell(
    http: httpx.AsyncClient,
    client: Client,
    requests: list[BenchRequest],
    arrivals: list[float],
    *,
    drain_s: float,
    label: str,
    duration_s: float = 0.0,
) -> CellResult:
    """Issue ``requests`` at ``arrivals``; the cell lasts at least ``duration_s``
    (a ramp's idle tail is part of it: scale-in happens there)."""
    started_at = time.monotonic()
    clock = monotonic_clock(started_at)
    records = [RequestRecord(r.index, t) for r, t in zip(requests, arrivals, strict=True)]
    tasks: list[asyncio.Task[None]] = []
    with tqdm(total=len(requests), desc=label, unit="req", leave=True) as bar:

        def finished(_: asyncio.Task[None]) -> None:
            bar.update(1)

        for request, record in zip(requests, records, strict=True):
            delay = record.scheduled_s - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(issue(client, http, request, record, clock))
            task.add_done_callback(finished)
            tasks.append(task)
        drained = True
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            drained = not pending
        if (idle := duration_s - clock()) > 0:
            await asyncio.sleep(idle)
    for record in records:
        if record.done_s is None and record.error is None:
            record.error = NOT_DRAINED
    return CellResult(records, drained, clock(), started_at)


async def wait_engines_idle(http: httpx.AsyncClient, timeout_s: float = 120) -> bool:
    """Until every engine holds no request (the graph's /metrics, or vLLM's own)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = engine_busy((await http.get("/metrics")).text)
        if busy and not any(busy):
            return True
        await asyncio.sleep(0.5)
    return False
