"""Coalesce a tier's SSE events into fewer streamed handle items.

Every item a replica yields through a streamed DeploymentHandle is one Ray
object (~350 µs here), and Serve's replica-to-caller stream has no
backpressure: when the engine outruns the hop, events queue up behind it and
the client falls ever further behind the engine. Consecutive SSE events are
plain strings, so joining them changes nothing a client sees (the same
events, in the same order) while the hop carries one item per batch. An inline
text stream that can move sends ``TextSteps`` (its events with the token ids
they came from), joined the same way.

The first event goes out at once (no TTFT cost). After each item, events
that arrive within ``window_s`` are held and sent together; a stream slower
than the window is never delayed. Anything that is not a string (a
``ServedBy`` marker, an error value, a unary response) goes on its own, in
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from deployments.messages.text_steps import TextSteps


class _End:
    """The source finished; ``error`` is what it raised, if anything."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def coalesced(
    source: AsyncGenerator[Any, None], window_s: float | None
) -> AsyncGenerator[Any, None]:
    """``source`` coalesced per ``window_s``; as it is with None (a step channel
    batches it instead)."""
    return source if window_s is None else coalesce_events(source, window_s)


async def coalesce_events(source: AsyncIterator[Any], window_s: float) -> AsyncGenerator[Any, None]:
    """``source``'s items, with runs of ``str`` events joined per ``window_s``."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # re-raised in the consumer, in order
            queue.put_nowait(_End(exc))
        else:
            queue.put_nowait(_End())

    task = asyncio.create_task(pump())
    loop = asyncio.get_running_loop()
    last_sent = -math.inf
    try:
        while True:
            batch = [await queue.get()]
            hold = last_sent + window_s - loop.time()
            if hold > 0 and isinstance(batch[0], (str, TextSteps)):
                await asyncio.sleep(hold)
            while not queue.empty():
                batch.append(queue.get_nowait())
            for item in _joined(batch):
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
            last_sent = loop.time()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _joined(batch: list[Any]) -> list[Any]:
    """Runs of consecutive strings (or ``TextSteps``) joined into one; everything
    else kept apart."""
    out: list[Any] = []
    run: list[Any] = []
    for item in batch:
        if run and type(item) is not type(run[0]):
            out.append(_join(run))
            run = []
        if isinstance(item, (str, TextSteps)):
            run.append(item)
        else:
            out.append(item)
    if run:
        out.append(_join(run))
    return out


def _join(run: list[Any]) -> Any:
    return "".join(run) if isinstance(run[0], str) else TextSteps.joined(run)
