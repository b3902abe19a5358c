"""Request channels: a request on a channel is run as its handle call would be, and its
items, first to last, reach the caller on the step channel; a refused, cancelled or
orphaned one ends as a call would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from deployments.transport.channel_reader import StepChannels
from deployments.transport.request_channel import (
    Cancel,
    Inbox,
    Inboxes,
    Raised,
    Refused,
    RequestReader,
    Start,
)
from deployments.transport.serve_internals import serve_request_id
from deployments.transport.step_channel import (
    STREAM_END,
    ChannelClosedError,
    OnChannel,
    WrongReplicaError,
)


def test_requests_of_one_turn_leave_as_one_batch() -> None:
    async def run() -> tuple[list[Any], list[Any]]:
        box = Inbox()
        batches = box.batches()
        for key in ("a", "b", "c"):
            box.put(Start(key, "m_on_channel", ()))
        first = await anext(batches)
        box.put(Cancel("a"))
        return first, await anext(batches)

    first, second = asyncio.run(run())
    assert [m.key for m in first] == ["a", "b", "c"]
    assert second == [Cancel("a")]


def test_a_request_its_channel_never_sent_is_reported_and_a_closed_inbox_takes_none() -> None:
    async def run() -> tuple[list[str], bool]:
        inboxes = Inboxes("me")
        unsent: list[str] = []
        channel = inboxes.serve("callee", "me", lambda start: unsent.append(start.key))
        waiting = asyncio.ensure_future(anext(channel))
        await asyncio.sleep(0)
        box = inboxes.get("callee")
        assert box is not None
        inboxes.close("callee")  # its step channel ended before the batch went
        box._items.append(Start("late", "m_on_channel", ()))
        with contextlib.suppress(StopAsyncIteration):
            await waiting
        with pytest.raises(ChannelClosedError):
            box.put(Start("after", "m_on_channel", ()))
        return unsent, inboxes.get("callee") is None

    assert asyncio.run(run()) == (["late"], True)


def test_a_request_channel_opened_for_another_replica_is_refused() -> None:
    async def run() -> None:
        channel = Inboxes("me").serve("callee", "someone-else", lambda _: None)
        await anext(channel)

    with pytest.raises(WrongReplicaError):
        asyncio.run(run())


class _Callee:
    """A callee's reader over a fake channel, with what it puts kept."""

    def __init__(self, admits: bool = True) -> None:
        self.channel: asyncio.Queue[Any] = asyncio.Queue()
        self.put: list[tuple[str, Any]] = []
        self.released = asyncio.Event()
        self.cancelled: list[str] = []

        async def call() -> AsyncIterator[list[Any]]:
            while True:
                batch = await self.channel.get()
                if isinstance(batch, BaseException):
                    raise batch
                yield batch

        self.reader = RequestReader(
            call,
            "caller",
            self._run,
            self._put,
            lambda: admits,
        )

    def _put(self, key: str, item: Any, urgent: bool) -> None:
        # Everything the reader itself puts goes at once: a request's first items
        # (and its end, when it has no stream of its own) wait for no window.
        assert urgent, (key, item)
        self.put.append((key, item))

    async def _run(self, message: Start, caller: str) -> AsyncIterator[Any]:
        assert caller == "caller"
        if message.method == "fails_on_channel":
            yield "before"
            raise RuntimeError("boom")
        if message.method == "whoami_on_channel":
            yield serve_request_id()
            return
        if message.method == "unary_on_channel":
            yield {"answer": message.args[0]}
            return
        yield "marker"
        yield OnChannel("callee", "first event")  # a bound stream: the rest is put by it
        try:
            await self.released.wait()
        except asyncio.CancelledError:
            self.cancelled.append(message.key)
            raise


def test_a_request_runs_and_its_items_go_on_the_step_channel_in_order() -> None:
    async def run() -> list[tuple[str, Any]]:
        callee = _Callee()
        callee.channel.put_nowait(
            [Start("u", "unary_on_channel", (7,)), Start("s", "s_on_channel", ())]
        )
        await asyncio.sleep(0.05)
        callee.released.set()
        await asyncio.sleep(0.05)
        callee.reader.stop()
        return callee.put

    put = asyncio.run(run())
    assert [item for key, item in put if key == "u"] == [{"answer": 7}, STREAM_END]
    # The bound stream's end is the method's own to put (Outboxes.bind), not the reader's.
    assert [item for key, item in put if key == "s"] == ["marker", "first event"]


def test_what_a_request_raises_reaches_its_caller_in_place() -> None:
    async def run() -> list[Any]:
        callee = _Callee()
        callee.channel.put_nowait([Start("f", "fails_on_channel", ())])
        await asyncio.sleep(0.05)
        callee.reader.stop()
        return [item for _, item in callee.put]

    before, raised = asyncio.run(run())
    assert before == "before"
    assert isinstance(raised, Raised) and str(raised.error) == "boom"


def test_a_full_callee_refuses_and_runs_nothing() -> None:
    async def run() -> list[tuple[str, Any]]:
        callee = _Callee(admits=False)
        callee.channel.put_nowait([Start("s", "s_on_channel", ())])
        await asyncio.sleep(0.05)
        assert not callee.reader.running
        callee.reader.stop()
        return callee.put

    assert asyncio.run(run()) == [("s", Refused())]


def test_cancel_ends_its_request_and_a_broken_channel_ends_all_of_its_callers() -> None:
    async def run() -> tuple[list[str], list[str]]:
        callee = _Callee()
        callee.channel.put_nowait([Start(k, "s_on_channel", ()) for k in ("a", "b", "c")])
        await asyncio.sleep(0.05)
        callee.channel.put_nowait([Cancel("a")])
        await asyncio.sleep(0.05)
        after_cancel = list(callee.cancelled)
        callee.channel.put_nowait(RuntimeError("caller died"))
        await asyncio.sleep(0.05)
        return after_cancel, sorted(callee.cancelled)

    after_cancel, after_break = asyncio.run(run())
    assert after_cancel == ["a"]
    assert after_break == ["a", "b", "c"]


class _Handle:
    """A DeploymentHandle stand-in: Serve's router picks ``picked``; calls are recorded."""

    deployment_name = "Generate"

    def __init__(self, picked: str) -> None:
        self.picked = picked
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def options(self, **_: Any) -> _Handle:
        return self

    @contextlib.asynccontextmanager
    async def choose_replica(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        assert kwargs.get("_reserve") is False  # pick only: nothing reserved on the replica
        yield SimpleNamespace(replica_id=self.picked)

    def __getattr__(self, method: str) -> Any:
        handle = self

        class _Method:
            def remote(self, *args: Any, **kwargs: Any) -> Any:
                handle.calls.append((method, args))
                return _Call(method)

        return _Method()


class _Call:
    def __init__(self, method: str) -> None:
        self.method = method
        self.cancelled = False

    def __aiter__(self) -> _Call:
        return self

    async def __anext__(self) -> Any:
        if self.method == "step_channel" and not self.cancelled:
            await asyncio.sleep(3600)
        if self.method == "m_on_channel":
            self.method = "done"
            return {"as": "call"}
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


def _caller(picked: str) -> tuple[StepChannels, Inboxes, _Handle]:
    handle = _Handle(picked)
    inboxes = Inboxes("me")
    channels = StepChannels(handle, "me", inboxes, ("app", "Derender"))  # type: ignore[arg-type]
    return channels, inboxes, handle


async def _opened(channels: StepChannels, inboxes: Inboxes, callee: str) -> list[Any]:
    """``callee``'s step and request channels opened; what its request channel sends."""
    channels._channel(callee)  # the step channel, as a first stream from there opens it
    sent: list[Any] = []

    async def drain() -> None:
        async for batch in inboxes.serve(callee, "me", channels.on_unsent):
            sent.extend(batch)

    _tasks.add(asyncio.ensure_future(drain()))
    await asyncio.sleep(0)
    assert inboxes.get(callee) is not None
    return sent


_tasks: set[asyncio.Future[None]] = set()


def test_a_request_goes_on_the_channel_of_the_replica_serves_router_picks() -> None:
    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        channels, inboxes, handle = _caller(picked="g1")
        box = await _opened(channels, inboxes, "g1")
        stream = channels.call("m_on_channel", "body", key="k1")
        await stream.chosen()
        await asyncio.sleep(0.01)
        sent = list(box)
        # What the callee puts under the key, as the channel's pump hands it on.
        queue = channels._queues["k1"]
        for item in ("marker", "event 1", "event 2", STREAM_END):
            queue.put_nowait(item)
        items = [item async for item in stream]
        channels.stop()
        return sent, items, handle.calls

    sent, items, calls = asyncio.run(run())
    assert sent == [Start("k1", "m_on_channel", ("body",), {})]
    assert items == ["marker", "event 1", "event 2"]
    assert [method for method, _ in calls] == ["step_channel"]  # no call for the request


def test_a_request_for_a_replica_without_a_channel_is_a_call() -> None:
    async def run() -> tuple[list[Any], list[str]]:
        channels, inboxes, handle = _caller(picked="g2")
        await _opened(channels, inboxes, "g1")
        items = [item async for item in channels.call("m_on_channel", "body", key="k1")]
        channels.stop()
        return items, [method for method, _ in handle.calls]

    items, methods = asyncio.run(run())
    assert items == [{"as": "call"}]
    assert methods == ["step_channel", "m_on_channel"]


def test_a_refused_request_is_made_a_call_and_a_raised_one_raises() -> None:
    async def run() -> tuple[list[Any], BaseException | None]:
        channels, inboxes, _ = _caller(picked="g1")
        await _opened(channels, inboxes, "g1")
        refused = channels.call("m_on_channel", "body", key="k1")
        await refused.chosen()
        channels._queues["k1"].put_nowait(Refused())
        items = [item async for item in refused]
        failing = channels.call("m_on_channel", "body", key="k2")
        await failing.chosen()
        channels._queues["k2"].put_nowait(Raised(ValueError("bad")))
        error = None
        try:
            async for _ in failing:
                pass
        except ValueError as exc:
            error = exc
        channels.stop()
        return items, error

    items, error = asyncio.run(run())
    assert items == [{"as": "call"}]
    assert isinstance(error, ValueError)


def test_a_cancelled_request_on_a_channel_sends_cancel() -> None:
    async def run() -> list[Any]:
        channels, inboxes, _ = _caller(picked="g1")
        box = await _opened(channels, inboxes, "g1")
        stream = channels.call("m_on_channel", "body", key="k1")
        await stream.chosen()
        stream.cancel()
        await asyncio.sleep(0.01)
        channels.stop()
        return list(box)

    sent = asyncio.run(run())
    assert sent == [Start("k1", "m_on_channel", ("body",), {}), Cancel("k1")]


def test_without_an_open_request_channel_the_call_is_made_at_once_and_nothing_picked() -> None:
    async def run() -> list[str]:
        channels, _, handle = _caller(picked="g1")
        handle.choose_replica = None  # type: ignore[method-assign,assignment]  # never asked
        channels.call("m_on_channel", "body", key="k1")
        return [method for method, _ in handle.calls]  # before anything awaited it

    assert asyncio.run(run()) == ["m_on_channel"]


def test_a_request_runs_in_its_callers_serve_request() -> None:
    async def run() -> list[Any]:
        callee = _Callee()
        request = ("/v1/chat/completions", "client-id-1", "default")
        callee.channel.put_nowait([Start("w", "whoami_on_channel", (), {}, request)])
        callee.channel.put_nowait([Start("x", "whoami_on_channel", ())])  # outside any
        await asyncio.sleep(0.05)
        callee.reader.stop()
        return [item for _, item in callee.put if item is not STREAM_END]

    assert asyncio.run(run()) == ["client-id-1", ""]
