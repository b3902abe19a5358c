"""Step channel outboxes: one item per wake-up for every stream, order kept per stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from deployments.messages.text_steps import TextSteps
from deployments.transport.channel_reader import StepChannels
from deployments.transport.coalesce import NoOutputEvent
from deployments.transport.step_channel import (
    STREAM_END,
    ChannelClosedError,
    OnChannel,
    Outbox,
    Outboxes,
    WrongReplicaError,
)


def test_events_put_in_one_step_leave_as_one_batch() -> None:
    async def run() -> list[list[tuple[str, object]]]:
        box = Outbox()
        batches = box.batches(window_s=0)
        # As an engine step wakes every stream: all put before the drain runs.
        for key in ("a", "b", "c"):
            box.put(key, f"{key}1")
        first = await anext(batches)
        box.put("a", "a2")
        second = await anext(batches)
        return [first, second]

    first, second = asyncio.run(run())
    assert first == [("a", "a1"), ("b", "b1"), ("c", "c1")]
    assert second == [("a", "a2")]


def test_a_streams_events_in_one_batch_leave_as_one_item() -> None:
    """Steps a window held: each stream's events joined, so its caller writes them once."""

    async def run() -> list[tuple[str, object]]:
        box = Outbox()
        batches = box.batches(window_s=0)
        for key, event in (("a", "a2 "), ("b", "b1 "), ("a", "a3 "), ("a", STREAM_END)):
            box.put(key, event)
        return await anext(batches)

    assert asyncio.run(run()) == [("a", "a2 a3 "), ("b", "b1 "), ("a", STREAM_END)]


def test_events_within_the_window_wait_to_go_together_and_the_first_never_waits() -> None:
    async def run() -> tuple[float, list[tuple[str, object]], float]:
        loop = asyncio.get_running_loop()
        box = Outbox()
        batches = box.batches(window_s=0.2)
        start = loop.time()
        box.put("a", 1)
        await anext(batches)
        first_after = loop.time() - start

        async def later() -> None:
            for i in range(3):
                await asyncio.sleep(0.02)
                box.put("a", 2 + i)

        task = asyncio.create_task(later())
        joined = await anext(batches)
        await task
        return first_after, joined, loop.time() - start

    first_after, joined, elapsed = asyncio.run(run())
    assert first_after < 0.1
    # Three events 20 ms apart, inside one 200 ms window: one item, in order.
    assert joined == [("a", 2), ("a", 3), ("a", 4)]
    assert elapsed >= 0.2


def test_a_streams_end_does_not_wait_out_the_window() -> None:
    """Nothing more of an ended stream can join its last events: they go at once, with
    whatever else waits, where the events before the end waited for the window."""

    async def run() -> tuple[list[tuple[str, object]], float]:
        loop = asyncio.get_running_loop()
        box = Outbox()
        batches = box.batches(window_s=60)
        box.put("a", 1)
        await anext(batches)  # the window starts
        start = loop.time()
        box.put("a", 2)
        box.put("b", "b1")

        async def next_batch() -> list[tuple[str, object]]:
            return await anext(batches)

        waiting = asyncio.create_task(next_batch())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # held for the window
        box.put("a", STREAM_END)
        batch = await asyncio.wait_for(waiting, 5)
        return batch, loop.time() - start

    batch, elapsed = asyncio.run(run())
    assert batch == [("a", 2), ("b", "b1"), ("a", STREAM_END)]
    assert elapsed < 30


def test_a_closed_channel_refuses_events_and_a_new_one_starts_empty() -> None:
    async def run() -> None:
        boxes = Outboxes("replica")
        box = boxes.get("caller")
        box.put("k", "before")
        drain = boxes.drain("caller", "replica", 0)
        assert await anext(drain) == [("k", "before")]
        await drain.aclose()  # the channel call ended (caller gone, replica stopping)
        with pytest.raises(ChannelClosedError):
            box.put("k", "after")
        assert boxes.get("caller") is not box

    asyncio.run(run())


def test_an_ended_channel_sends_what_is_queued_then_ends() -> None:
    # A Generate replica that Serve stops, once its streams moved (Generate._watch).
    async def run() -> list[list[tuple[str, object]]]:
        boxes = Outboxes("replica")
        boxes.get("caller").put("k", STREAM_END)
        boxes.end()
        return [batch async for batch in boxes.drain("caller", "replica", 0)]

    assert asyncio.run(run()) == [[("k", STREAM_END)]]


def test_an_idle_channel_sends_empty_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # A channel whose caller died ends at its next send, freeing its slot.
    monkeypatch.setattr("deployments.transport.step_channel.KEEPALIVE_S", 0.05)

    async def run() -> list[tuple[str, object]]:
        return await anext(Outbox().batches(window_s=0))

    assert asyncio.run(run()) == []


def test_a_bound_call_yields_what_precedes_the_stream_then_binds_it_with_its_first_event() -> None:
    async def marker_then_events() -> AsyncIterator[object]:
        yield ("served", "by")  # not an event: goes on the call itself
        yield "data: 1\n\n"
        yield "data: 2\n\n"

    async def run() -> tuple[list[object], list[tuple[str, object]]]:
        boxes = Outboxes("replica")
        on_call = [item async for item in boxes.bind(marker_then_events(), "caller", "k")]
        return on_call, await anext(boxes.get("caller").batches(0))

    on_call, batch = asyncio.run(run())
    # The first event rides on OnChannel: a first token never waits for a channel batch.
    assert on_call == [("served", "by"), OnChannel("replica", "data: 1\n\n")]
    assert batch == [("k", "data: 2\n\n"), ("k", STREAM_END)]


def test_an_inline_streams_text_steps_are_events_and_travel_on_the_channel() -> None:
    # An inline stream that can move yields TextSteps, not str (messages/text_steps.py).
    first = TextSteps(NoOutputEvent("data: role\n\n"), 1, [[1]])
    second = TextSteps("data: 2\n\n", 1, [[2]], finished=True)

    async def marker_then_steps() -> AsyncIterator[object]:
        yield ("served", "by")
        yield first
        yield second

    async def run() -> tuple[list[object], list[tuple[str, object]]]:
        boxes = Outboxes("replica")
        on_call = [item async for item in boxes.bind(marker_then_steps(), "caller", "k")]
        return on_call, await anext(boxes.get("caller").batches(0))

    on_call, batch = asyncio.run(run())
    assert on_call == [("served", "by"), OnChannel("replica", first)]
    bound = on_call[1]
    assert isinstance(bound, OnChannel)
    assert type(bound.first.text) is str  # the NoOutputEvent marker stays in this process
    assert batch == [("k", second), ("k", STREAM_END)]


def test_a_channel_call_that_reached_another_replica_is_refused() -> None:
    async def run() -> None:
        await anext(Outboxes("replica").drain("caller", "other", 0))

    with pytest.raises(WrongReplicaError):
        asyncio.run(run())


class _EndedCall:
    """A channel call whose replica went away: it ends at once with an error."""

    def __aiter__(self) -> _EndedCall:
        return self

    async def __anext__(self) -> object:
        raise ConnectionError("replica gone")

    def cancel(self) -> None:
        pass


class _Handle:
    deployment_name = "Generate"

    def options(self, **_: object) -> _Handle:
        return self

    @property
    def step_channel(self) -> _Handle:
        return self

    def remote(self, *_: object, **__: object) -> _EndedCall:
        return _EndedCall()


def test_a_channel_that_ended_is_forgotten() -> None:
    """Replicas come and go under autoscaling, each with a new id: a dead one's channel
    must not stay in the caller's table for the process's life."""

    async def run() -> tuple[bool, bool]:
        channels = StepChannels(_Handle(), "caller")  # type: ignore[arg-type]
        channel = channels._channel("gone-replica")
        held_while_open = "gone-replica" in channels._channels
        await channel._task
        return held_while_open, "gone-replica" in channels._channels

    assert asyncio.run(run()) == (True, False)


def test_an_event_without_output_does_not_hold_the_next_and_leaves_unmarked() -> None:
    """A tier stream's empty chunk (its engine's first token held back by a parser)
    goes on the channel; the first text after it must not wait out the window (a
    minute here: the test would time out)."""

    async def run() -> list[list[tuple[str, object]]]:
        box = Outbox()
        batches = box.batches(window_s=60)
        box.put("a", NoOutputEvent("data: {}\n\n"))
        first = await anext(batches)
        box.put("a", 'data: {"text": 1}\n\n')
        return [first, await anext(batches)]

    first, second = asyncio.run(asyncio.wait_for(run(), timeout=30))
    assert first == [("a", "data: {}\n\n")] and type(first[0][1]) is str
    assert second == [("a", 'data: {"text": 1}\n\n')]


def test_open_channels_count_the_channel_calls_being_served() -> None:
    async def run() -> list[int]:
        boxes = Outboxes("replica")
        counts = [boxes.open_channels]
        boxes.get("a").put("k", 1)
        boxes.get("b").put("k", 2)  # a box with events is no channel until its call drains it
        counts.append(boxes.open_channels)
        first, second = boxes.drain("a", "replica", 0), boxes.drain("b", "replica", 0)
        await anext(first)
        await anext(second)
        counts.append(boxes.open_channels)
        await first.aclose()
        counts.append(boxes.open_channels)
        return counts

    assert asyncio.run(run()) == [0, 0, 2, 1]


def test_an_urgent_event_goes_at_once_within_the_window() -> None:
    """A request channel's first items (``request_channel.RequestReader``) wait for no
    window, as a stream's first event on ``OnChannel`` does not (a minute here: the
    test would time out)."""

    async def run() -> list[tuple[str, object]]:
        box = Outbox()
        batches = box.batches(window_s=60)
        box.put("a", "a1")
        await anext(batches)
        box.put("b", "b-first", urgent=True)
        return await anext(batches)

    assert asyncio.run(asyncio.wait_for(run(), timeout=30)) == [("b", "b-first")]
