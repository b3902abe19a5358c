"""Step channels: one streamed handle item per engine step per replica pair.

A streamed DeploymentHandle call pays one Ray item per yield (~300–570 µs of
CPU here, on both ends). Per-stream coalescing joins nothing when the engine
paces every stream at one token per step, so N streams cost N items a step.
A caller replica instead opens one long-lived *channel* call to each replica
it reads streams from (the Ingress and Derender from Generate, the Ingress from
Derender); every stream it binds there puts its events in the channel's outbox,
and the channel yields whatever the step produced, for all those streams, as
one item.

Each stream keeps its own streamed call (a ``*_on_channel`` method), which carries
what comes before the stream (an error value, a unary response) and then, instead
of the events, where they go (``OnChannel``, with the stream's first event, so a
first token never waits for a channel batch). A ``ServedBy`` marker rides with the
item after it (``Preceded``): an item of its own would cost a Ray item on both ends
for a value the caller reads only with the next one (``tier_calls`` waits for the
first item past it before it answers). It
stays open until the stream ends, so that cancelling it (client gone, abort,
caller cancelled) stops the work exactly as before, and so that its failure
(an engine that ends it with an error, a dead replica) reaches the caller.
Per-stream order holds because a stream's events travel on one channel. A
broken channel fails every stream bound to it with the channel's error. In a
batch, a stream's consecutive events (the steps a window held) go as one item,
so its caller takes, passes on and writes one item per batch, not one per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ray.serve.deployment import Deployment
from ray.serve.handle import DeploymentHandle

from deployments.messages.replies import ServedBy
from deployments.messages.text_steps import TextSteps
from deployments.observability.metrics import graph_metrics
from deployments.transport.coalesce import joined_by_stream, plain, without_output

# A stream's last item in its channel: the stream ended.
STREAM_END = None
# An idle channel sends an empty batch this often: a channel whose caller died
# then ends, and frees the slot it holds on the replica.
KEEPALIVE_S = 10.0


def with_channel_slots(deployment: Deployment, callers: int) -> Deployment:
    """``deployment`` with a slot on each replica for each of ``callers`` replicas that
    may hold a step channel there: Serve counts a channel call as an ongoing request,
    and without a slot of its own it would take a request's."""
    return deployment.options(max_ongoing_requests=deployment.max_ongoing_requests + callers)


@dataclass(frozen=True)
class OnChannel:
    """A bound call's item: the stream's ``first`` event, and where the rest come
    from: ``replica``'s channel."""

    replica: str
    first: Any


@dataclass(frozen=True)
class Preceded:
    """Two items of a bound call in one: ``marker`` (a ``ServedBy``), then ``item``."""

    marker: ServedBy
    item: Any


class ChannelClosedError(RuntimeError):
    """The caller's channel to this replica broke; the stream cannot be delivered."""


class WrongReplicaError(RuntimeError):
    """A channel call reached a replica other than the one it was opened for."""


class Outbox:
    """One caller's events on one replica, drained by its channel call."""

    def __init__(self) -> None:
        self._items: list[tuple[str, Any]] = []
        self._oldest = 0.0  # when the first of ``_items`` was put (perf_counter)
        self._output = False  # whether ``_items`` hold anything but ``without_output`` events
        self._wake = asyncio.Event()
        # Set by a stream's end: nothing more of that stream can join the batch, so
        # holding it for the window would only delay that stream's last events.
        self._flush = asyncio.Event()
        self.closed = False
        self._ending = False

    def put(self, key: str, item: Any) -> None:
        """Queue ``item`` for the channel."""
        if self.closed:
            raise ChannelClosedError("the caller's step channel to this replica is closed")
        if not self._items:
            self._oldest = time.perf_counter()
        self._output = self._output or not without_output(item)
        self._items.append((key, plain(item)))
        if item is STREAM_END:
            self._flush.set()
        self._wake.set()

    def end(self) -> None:
        """End the channel once what is queued has gone (its replica is leaving)."""
        self._ending = True
        self._flush.set()
        self._wake.set()

    async def batches(self, window_s: float) -> AsyncIterator[list[tuple[str, Any]]]:
        """Everything put since the last batch, one list per wake-up, each stream's
        consecutive events in it joined (``coalesce.joined_by_stream``).

        One ``sleep(0)`` before draining lets every stream the engine step just
        woke put its event first. After a batch, events within ``window_s``
        wait to go together; the first event after a quiet spell never waits
        (and a stream's first event is not here: it rides on ``OnChannel``), nor
        does a stream's end: the batch goes at once with whatever else waits. A
        batch of ``without_output`` events (an empty chunk) does not start the
        window, as in ``coalesce.py``.
        """
        loop = asyncio.get_running_loop()
        last_sent = -math.inf
        metrics = graph_metrics()
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    await self._wake.wait()
            except TimeoutError:
                yield []  # fails once the caller is gone, which ends the channel
                continue
            hold = last_sent + window_s - loop.time()
            if hold > 0 and not self._flush.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(hold):
                        await self._flush.wait()
            await asyncio.sleep(0)
            self._wake.clear()
            self._flush.clear()
            items, self._items = self._items, []
            output, self._output = self._output, False
            if items:
                metrics.channel_batch_items.observe(len(items))
                metrics.channel_wait_seconds.observe(time.perf_counter() - self._oldest)
                yield joined_by_stream(items)
            if self._ending:
                return
            if output:
                last_sent = loop.time()


class Outboxes:
    """The callee replica's side: an outbox per caller replica."""

    def __init__(self, replica: str) -> None:
        self._replica = replica
        self._boxes: dict[str, Outbox] = {}
        self.bound = 0
        """Streams bound here right now (``bind``)."""

    def get(self, caller: str) -> Outbox:
        """The caller's outbox; events wait in it until the caller's channel drains it."""
        box = self._boxes.get(caller)
        if box is None:
            box = self._boxes[caller] = Outbox()
        return box

    async def bind(self, items: AsyncIterator[Any], caller: str, key: str) -> AsyncIterator[Any]:
        """A bound call's body: ``items`` as the plain call would yield them, up to
        the first SSE event; that one on ``OnChannel``, and the rest on the caller's
        channel. A ``ServedBy`` marker goes with the item after it (``Preceded``).
        Raises what ``items`` raises, or if the channel broke."""
        outbox: Outbox | None = None
        marker: ServedBy | None = None  # held for the next item (``Preceded``)
        self.bound += 1
        try:
            async for item in items:
                if outbox is None:
                    if isinstance(item, ServedBy) and marker is None:
                        marker = item
                        continue
                    if isinstance(item, (str, TextSteps)):
                        outbox = self.get(caller)
                        item = OnChannel(self._replica, plain(item))
                    if marker is not None:
                        item, marker = Preceded(marker, item), None
                    yield item
                    continue
                outbox.put(key, item)
            if marker is not None:  # nothing came after it
                yield marker
            if outbox is not None:
                outbox.put(key, STREAM_END)
        finally:
            self.bound -= 1

    def end(self) -> None:
        """End every caller's channel here once what is queued has gone: a replica
        that Serve is stopping and whose streams moved, so that Serve, which counts
        a channel as an ongoing request, need not wait for it."""
        for box in self._boxes.values():
            box.end()

    async def drain(
        self, caller: str, replica: str, window_s: float
    ) -> AsyncIterator[list[tuple[str, Any]]]:
        """The channel call's body; when it ends, the caller's bound streams fail."""
        if replica != self._replica:
            raise WrongReplicaError(f"channel for replica {replica} reached {self._replica}")
        box = self.get(caller)
        try:
            async for batch in box.batches(window_s):
                yield batch
        finally:
            box.closed = True
            if self._boxes.get(caller) is box:
                del self._boxes[caller]


class ChannelSource:
    """A deployment whose callers read its streams on step channels: it keeps an
    ``Outboxes`` and a window, and serves the ``step_channel`` call."""

    _outboxes: Outboxes
    _coalesce_s: float

    async def step_channel(self, caller: str, replica: str) -> AsyncIterator[Any]:
        """The caller's step channel: its bound streams' events, one item per
        wake-up (``PinnedRouter`` routes the call here by ``replica``)."""
        async for batch in self._outboxes.drain(caller, replica, self._coalesce_s):
            yield batch


@dataclass
class _Failed:
    error: BaseException


class StepChannels:
    """The caller's side: its channels to one deployment's replicas, and its bound streams."""

    def __init__(self, handle: DeploymentHandle[Any], caller: str) -> None:
        self._handle = handle.options(stream=True)
        self._caller = caller
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._channels: dict[str, _Channel] = {}

    def call(self, method: str, *args: Any, key: str | None = None, **kwargs: Any) -> ChannelStream:
        """``method(*args, **kwargs)`` as a bound stream; iterate it as the plain
        call's response.

        ``key`` names the stream on its channel, and to the callee: unique across
        callers (a uuid unless given), so a caller of this caller can end the
        callee's work by it when this one dies (``EngineCalls.abort_calls``)."""
        key = key or uuid.uuid4().hex
        self._queues[key] = asyncio.Queue()
        response = getattr(self._handle, method).remote(*args, self._caller, key, **kwargs)
        return ChannelStream(self, key, response)

    async def _events(self, key: str, response: Any, bound: OnChannel) -> AsyncIterator[Any]:
        """The stream's events from its replica's channel, until the stream ends.

        The call itself ends with the stream; if it fails instead (an error in
        the replica, the replica gone), that error ends the stream here.
        """
        queue = self._queues.get(key)
        if queue is None:  # cancelled before its stream began
            return
        channel = self._channel(bound.replica)
        channel.keys.add(key)
        if channel.error is not None:
            queue.put_nowait(_Failed(channel.error))
        watcher = asyncio.create_task(_fail_on_error(response, queue))
        try:
            yield bound.first
            while True:
                item = await queue.get()
                if item is STREAM_END:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            watcher.cancel()
            channel.keys.discard(key)

    def _close(self, key: str) -> None:
        self._queues.pop(key, None)

    def _channel(self, replica: str) -> _Channel:
        channel = self._channels.get(replica)
        if channel is None or channel.error is not None:
            # Outside the request that needed it: Serve gives a replica's handle
            # calls the request's own internal id, routes calls that share one as
            # one (so the pin would be lost), and cancels them with the request.
            detached = contextvars.Context()
            call = detached.run(self._handle.step_channel.remote, self._caller, replica=replica)
            channel = self._channels[replica] = detached.run(
                _Channel, call, self._queues, lambda ended: self._forget(replica, ended)
            )
        return channel

    def _forget(self, replica: str, channel: _Channel) -> None:
        """Drop a channel that ended (its replica gone, most often): replicas come and
        go with autoscaling, and each has an id of its own, never reused."""
        if self._channels.get(replica) is channel:
            del self._channels[replica]

    def stop(self) -> None:
        for channel in self._channels.values():
            channel.stop()


class ChannelStream:
    """A bound stream, read as the plain streamed call would be: the same items,
    with the events taken from the channel. ``cancel`` cancels the call."""

    def __init__(self, channels: StepChannels, key: str, response: Any) -> None:
        self._channels = channels
        self.key = key
        self.handle_response = response
        """The call's own response, which ``replica_assignment.wait_routed`` watches."""
        self._items = self._read(channels, key, response)

    @staticmethod
    async def _read(channels: StepChannels, key: str, response: Any) -> AsyncIterator[Any]:
        try:
            async for item in response:
                if isinstance(item, Preceded):
                    yield item.marker
                    item = item.item
                if isinstance(item, OnChannel):
                    async for event in channels._events(key, response, item):
                        yield event
                    return
                yield item
        finally:
            channels._close(key)

    def __aiter__(self) -> ChannelStream:
        return self

    async def __anext__(self) -> Any:
        return await anext(self._items)

    def cancel(self) -> None:
        self.handle_response.cancel()
        self._channels._close(self.key)


class _Channel:
    """One channel call: routes each batch's events to their streams' queues."""

    def __init__(
        self,
        call: Any,
        queues: dict[str, asyncio.Queue[Any]],
        on_end: Callable[[_Channel], None] = lambda _: None,
    ) -> None:
        self.keys: set[str] = set()
        self.error: BaseException | None = None
        self._call = call
        self._queues = queues
        self._on_end = on_end
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        queues = self._queues
        try:
            async for batch in self._call:
                for key, item in batch:
                    queue = queues.get(key)
                    if queue is not None:
                        queue.put_nowait(item)
            error: BaseException = ChannelClosedError("the step channel ended")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # reaches every stream bound here
            error = exc
        self.error = error
        for key in self.keys:
            queue = queues.get(key)
            if queue is not None:
                queue.put_nowait(_Failed(error))
        self._on_end(self)

    def stop(self) -> None:
        self._task.cancel()
        self._call.cancel()


async def _fail_on_error(call: Any, queue: asyncio.Queue[Any]) -> None:
    """Runs the rest of a bound call; its error, if any, ends the stream."""
    with contextlib.suppress(asyncio.CancelledError):
        try:
            async for _ in call:
                pass
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait(_Failed(exc))
