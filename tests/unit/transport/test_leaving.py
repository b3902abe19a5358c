"""A replica that Serve stops: noticed once, and its step channels ended only once
no stream is bound to them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from deployments.transport.leaving import LeaveWatch
from deployments.transport.step_channel import STREAM_END, Outboxes


def test_leaving_is_told_once_and_channels_end_only_when_idle() -> None:
    async def run() -> tuple[list[bool], list[object]]:
        stopping = False
        boxes = Outboxes("replica")
        watch = LeaveWatch(boxes, probe=lambda: stopping)
        polls = [watch.poll(busy=True)]
        stopping = True
        polls += [watch.poll(busy=True), watch.poll(busy=True)]
        boxes.get("caller").put("k", "data: 1\n\n")
        drain = boxes.drain("caller", "replica", 0)
        first = await anext(drain)
        # Still busy: the channel stays open (its next batch waits).
        pending = asyncio.ensure_future(anext(drain))
        await asyncio.sleep(0.05)
        assert not pending.done()
        polls.append(watch.poll(busy=False))
        # Idle: the channel ends, with nothing more to send.
        ended = await asyncio.wait_for(asyncio.gather(pending, return_exceptions=True), 1)
        return polls, [first, *ended]

    polls, batches = asyncio.run(run())
    assert polls == [False, True, False, False]
    assert batches[0] == [("k", "data: 1\n\n")]
    assert isinstance(batches[1], StopAsyncIteration)


def test_outboxes_count_the_streams_bound_to_them() -> None:
    async def events() -> AsyncIterator[object]:
        yield "data: 1\n\n"
        yield "data: 2\n\n"

    async def run() -> list[int]:
        boxes = Outboxes("replica")
        seen = [boxes.bound]
        bound = boxes.bind(events(), "caller", "k")
        await anext(bound)
        seen.append(boxes.bound)
        async for _ in bound:
            pass
        seen.append(boxes.bound)
        assert (await anext(boxes.get("caller").batches(0)))[-1] == ("k", STREAM_END)
        return seen

    assert asyncio.run(run()) == [0, 1, 0]
