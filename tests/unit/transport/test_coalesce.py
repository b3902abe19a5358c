"""Coalescing SSE events between tiers: same events, same order, fewer items."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import pytest

from deployments.messages.text_steps import TextSteps
from deployments.text.sse import DONE, sse_data, sse_payloads, sse_stream_payloads
from deployments.transport.coalesce import NoOutputEvent, coalesce_events, joined_by_stream
from deployments.transport.step_channel import STREAM_END


def event(i: int) -> str:
    return sse_data({"i": i})


async def timed(items: list[tuple[float, Any]]) -> AsyncIterator[Any]:
    """Yields each item after its delay (seconds)."""
    for delay, item in items:
        await asyncio.sleep(delay)
        yield item


async def collect(source: AsyncIterator[Any], window_s: float) -> list[tuple[float, Any]]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    return [(loop.time() - start, item) async for item in coalesce_events(source, window_s)]


def test_first_event_is_not_held_and_a_burst_travels_as_one_item() -> None:
    async def run() -> list[Any]:
        sent_first = asyncio.Event()

        async def source() -> AsyncIterator[str]:
            yield event(0)
            await sent_first.wait()
            for i in range(1, 6):  # a burst: all queued in one loop turn
                yield event(i)

        out = []
        async for item in coalesce_events(source(), window_s=0):
            out.append(item)
            sent_first.set()
        return out

    out = asyncio.run(run())
    assert out == [event(0), "".join(event(i) for i in range(1, 6))]


def test_events_within_the_window_are_held_and_joined_with_later_ones() -> None:
    """With a window, events that arrive apart in time (each after the one
    before left) travel as one item once the window since the last item ends;
    an event after the window goes on its own. The time is checked only from
    below (a hold can only be longer on a loaded host)."""
    window = 0.3

    async def run() -> list[tuple[float, Any]]:
        step = asyncio.Event()

        async def source() -> AsyncIterator[str]:
            yield event(0)
            await step.wait()
            yield event(1)
            await asyncio.sleep(0.01)  # a later turn of the loop: not one burst
            yield event(2)
            step.clear()
            await step.wait()
            yield event(3)

        loop = asyncio.get_running_loop()
        start = loop.time()
        out = []
        async for item in coalesce_events(source(), window_s=window):
            out.append((loop.time() - start, item))
            if len(out) == 2:
                await asyncio.sleep(window * 1.5)  # the next event comes after the window
            step.set()
        return out

    out = asyncio.run(run())
    assert [item for _, item in out] == [event(0), event(1) + event(2), event(3)]
    (first, _), (held, _), _ = out
    assert held - first >= window * 0.9  # held to the end of the window


def test_events_that_come_one_at_a_time_go_one_at_a_time() -> None:
    async def run() -> list[Any]:
        received = asyncio.Event()

        async def source() -> AsyncIterator[str]:
            for i in range(4):
                received.clear()
                yield event(i)
                await received.wait()  # the next event exists only after this one left
                await asyncio.sleep(0.002)  # and after the window

        out = []
        async for item in coalesce_events(source(), window_s=0.001):
            out.append(item)
            received.set()
        return out

    assert asyncio.run(run()) == [event(i) for i in range(4)]


def test_non_string_items_keep_their_place() -> None:
    marker, unary = object(), {"unary": True}
    items = [marker, event(0), event(1), unary, event(2)]
    out = asyncio.run(collect(timed([(0, i) for i in items]), window_s=0.05))
    flat = [item for _, item in out]
    assert flat[0] is marker
    assert flat.index(unary) > 0
    text = "".join(i for i in flat if isinstance(i, str))
    assert list(sse_payloads(text)) == [{"i": 0}, {"i": 1}, {"i": 2}]
    # The dict did not get joined into a string run.
    assert all(isinstance(i, str) or i is marker or i is unary for i in flat)


def test_an_inline_streams_steps_are_joined_with_its_events() -> None:
    """A movable inline stream's items (``TextSteps``) join as strings do, their
    engine steps and event counts with them, and the last one's ``finished``."""
    items = [
        TextSteps(event(0), 1, [[1]]),
        TextSteps(event(1), 1, [[2, 3], [4]]),
        TextSteps(event(2), 1, [], finished=True),
    ]
    out = [item for _, item in asyncio.run(collect(timed([(0, i) for i in items]), 0.05))]
    assert all(isinstance(item, TextSteps) for item in out) and len(out) < len(items)
    assert "".join(item.text for item in out) == "".join(item.text for item in items)
    assert [step for item in out for step in item.steps] == [[1], [2, 3], [4]]
    assert sum(item.events for item in out) == 3 and out[-1].finished


def test_an_error_in_the_source_arrives_after_the_events_before_it() -> None:
    async def failing() -> AsyncIterator[str]:
        yield event(0)
        yield event(1)
        raise ValueError("engine died")

    async def run() -> list[str]:
        seen: list[str] = []
        with pytest.raises(ValueError, match="engine died"):
            async for item in coalesce_events(failing(), window_s=0.01):
                seen.append(item)
        return seen

    seen = asyncio.run(run())
    assert list(sse_payloads("".join(seen))) == [{"i": 0}, {"i": 1}]


def test_closing_the_consumer_closes_the_source() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[str]:
        try:
            i = 0
            while True:
                yield event(i)
                i += 1
                await asyncio.sleep(0.001)
        finally:
            closed.set()

    async def run() -> bool:
        stream = cast(AsyncGenerator[Any, None], coalesce_events(endless(), window_s=0.01))
        await anext(stream)
        await anext(stream)
        await stream.aclose()
        return closed.is_set()

    assert asyncio.run(run())


def test_joined_events_read_back_one_by_one_up_to_done() -> None:
    async def source() -> AsyncIterator[str]:
        yield event(0) + ": keep-alive\n\n" + event(1)
        yield event(2) + f"data: {DONE}\n\n" + event(99)

    async def run() -> list[dict[str, Any]]:
        return [p async for p in sse_stream_payloads(source())]

    assert asyncio.run(run()) == [{"i": 0}, {"i": 1}, {"i": 2}]


@pytest.mark.parametrize("steps", [False, True], ids=["events", "text-steps"])
def test_an_opening_without_output_does_not_hold_the_first_text_behind_it(steps: bool) -> None:
    """A chat stream opens with its role chunk (no text) at the engine's first output;
    its first text comes a step later. Were the opening to start the window, that
    text would wait the whole window (a minute here, so the test would time out)."""

    def item(text: str) -> Any:
        return TextSteps(text, 1, [[7]]) if steps else text

    async def run() -> list[Any]:
        received = asyncio.Event()

        async def source() -> AsyncIterator[Any]:
            yield item(NoOutputEvent(event(0)))
            await received.wait()  # the first text exists only once the opening left
            yield item(event(1))

        out = []
        async for sent in coalesce_events(source(), window_s=60):
            out.append(sent)
            received.set()
        return out

    out = asyncio.run(asyncio.wait_for(run(), timeout=30))
    texts = [sent.text if steps else sent for sent in out]
    assert texts == [event(0), event(1)]
    assert [type(text) for text in texts] == [str, str]  # the marker stays in this process


def test_an_opening_joins_the_text_queued_with_it_into_one_item() -> None:
    items = [NoOutputEvent(event(0)), event(1), event(2)]

    async def burst() -> AsyncIterator[str]:  # one loop turn: all queued at once
        for item in items:
            yield item

    out = [item for _, item in asyncio.run(collect(burst(), 0.05))]
    assert out == ["".join(items)]
    assert type(out[0]) is str


def test_a_batch_joins_each_streams_consecutive_events_and_keeps_every_order() -> None:
    """A step channel's batch: each stream's runs of strings (or ``TextSteps``) become
    one item at the run's first place; an item of another kind ends the run there, and
    streams interleave as they came."""
    steps = [TextSteps("s1", 1, [[7]]), TextSteps("s2", 1, [[8]], finished=True)]
    batch = [
        ("a", "a1"),
        ("b", NoOutputEvent("b0")),
        ("a", "a2"),
        ("b", "b1"),
        ("c", steps[0]),
        ("a", STREAM_END),
        ("c", steps[1]),
        ("b", 42),
        ("b", "b2"),
    ]
    joined = joined_by_stream(batch)
    assert joined == [
        ("a", "a1a2"),
        ("b", "b0b1"),
        ("c", TextSteps("s1s2", 2, [[7], [8]], finished=True)),
        ("a", STREAM_END),
        ("b", 42),
        ("b", "b2"),
    ]
    # What leaves is plain: the marker joined into a stream's text is gone.
    assert type(joined[1][1]) is str
    assert joined_by_stream([("a", "x")]) == [("a", "x")] and joined_by_stream([]) == []
