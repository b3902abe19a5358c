"""Step channels, the caller's side: its channel call to each replica it reads
streams from, and each bound stream read as the plain streamed call would be.

The callee's side, and why step channels exist, is ``step_channel.py``. A caller
with ``Inboxes`` sends a request on a request channel where the replica Serve's
router picks for it has one open (``request_channel.py``), and reads all of it,
from its first item, on that replica's step channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ray.serve.handle import DeploymentHandle

from deployments.observability.metrics import graph_metrics
from deployments.transport.replica_assignment import no_replica_to_route_to
from deployments.transport.request_channel import (
    Cancel,
    Inboxes,
    Raised,
    Refused,
    Start,
)
from deployments.transport.serve_internals import pick_replica, serve_request_fields
from deployments.transport.step_channel import (
    STREAM_END,
    ChannelClosedError,
    OnChannel,
)

# (application, deployment) of the caller, for the callee's way back (``channel_source``).
ReplyTo = tuple[str, str]


@dataclass
class _Failed:
    error: BaseException


class StepChannels:
    """The caller's side: its channels to one deployment's replicas, and its bound streams."""

    def __init__(
        self,
        handle: DeploymentHandle[Any],
        caller: str,
        inboxes: Inboxes | None = None,
        reply_to: ReplyTo | None = None,
    ) -> None:
        self._handle = handle.options(stream=True)
        self._caller = caller
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._channels: dict[str, _Channel] = {}
        self._inboxes = inboxes if reply_to is not None else None
        self._reply_to = reply_to
        self._callee = handle.deployment_name

    def call(self, method: str, *args: Any, key: str | None = None, **kwargs: Any) -> ChannelStream:
        """``method(*args, **kwargs)`` as a bound stream; iterate it as the plain
        call's response.

        ``key`` names the stream on its channel, and to the callee: unique across
        callers (a uuid unless given), so a caller of this caller can end the
        callee's work by it when this one dies (``EngineCalls.abort_calls``)."""
        key = key or uuid.uuid4().hex
        self._queues[key] = asyncio.Queue()
        return ChannelStream(self, key, Start(key, method, args, kwargs))

    def count_sent(self, via: str) -> None:
        if self._inboxes is not None:  # a caller without request channels sends calls only
            graph_metrics().requests_sent.inc(tags={"callee": self._callee, "via": via})

    def _remote(self, start: Start) -> Any:
        """The request as a handle call of its own."""
        method = getattr(self._handle, start.method)
        return method.remote(*start.args, self._caller, start.key, **start.kwargs)

    def may_send_on_channel(self) -> bool:
        """Whether any replica has a request channel open to this caller."""
        return self._inboxes is not None and self._inboxes.any_open()

    async def _sent_on_channel(self, start: Start) -> str | None:
        """The replica whose request channel took ``start``, if Serve's router picked
        one that has a channel open; None: make it a handle call."""
        inboxes = self._inboxes
        if inboxes is None or no_replica_to_route_to(self._handle):
            return None
        loads = {replica: len(channel.keys) for replica, channel in self._channels.items()}
        replica = await pick_replica(
            self._handle, *start.args, self._caller, start.key, loads=loads, **start.kwargs
        )
        inbox = None if replica is None else inboxes.get(replica)
        channel = None if replica is None else self._channels.get(replica)
        if inbox is None or channel is None or channel.error is not None:
            return None
        queue = self._queues.get(start.key)
        if queue is None:  # cancelled while the router picked
            return None
        channel.keys.add(start.key)
        inbox.put(dataclasses.replace(start, request=serve_request_fields()))
        return replica

    def on_unsent(self, start: Start) -> None:
        """A request its channel ended before sending: its replica is gone (its caller
        may make it again elsewhere, ``replica_loss.callee_lost``)."""
        queue = self._queues.get(start.key)
        if queue is not None:
            queue.put_nowait(_Failed(ChannelClosedError("the request channel ended")))

    def _cancel_on_channel(self, key: str, replica: str) -> None:
        self._close(key)
        channel = self._channels.get(replica)
        if channel is not None:
            channel.keys.discard(key)
        inbox = None if self._inboxes is None else self._inboxes.get(replica)
        if inbox is not None:
            inbox.put(Cancel(key))

    async def _on_channel(self, key: str, replica: str) -> AsyncIterator[Any]:
        """A request sent on ``replica``'s request channel: every item of it, from
        its step channel; a ``Refused`` one raises ``_RefusedError`` (``ChannelStream._read``
        then makes it a handle call)."""
        queue = self._queues.get(key)
        if queue is None:
            return
        try:
            async for item in _queued(queue):
                if isinstance(item, Raised):
                    raise item.error
                if isinstance(item, Refused):
                    raise _RefusedError()
                yield item
        finally:
            channel = self._channels.get(replica)
            if channel is not None:
                channel.keys.discard(key)

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
            async for item in _queued(queue):
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
            back = {} if self._inboxes is None else {"reply_to": self._reply_to}
            call = detached.run(
                self._handle.step_channel.remote, self._caller, replica=replica, **back
            )
            channel = self._channels[replica] = detached.run(
                _Channel, call, self._queues, lambda ended: self._forget(replica, ended)
            )
        return channel

    def _forget(self, replica: str, channel: _Channel) -> None:
        """Drop a channel that ended (its replica gone, most often): replicas come and
        go with autoscaling, and each has an id of its own, never reused."""
        if self._channels.get(replica) is channel:
            del self._channels[replica]
            if self._inboxes is not None:
                self._inboxes.close(replica)

    def stop(self) -> None:
        for channel in self._channels.values():
            channel.stop()


class ChannelStream:
    """A bound stream, read as the plain streamed call would be: the same items,
    with the events taken from the channel. ``cancel`` cancels the call.

    It is a handle call of its own, made at once, unless a replica has a request
    channel open to this caller; then where it goes is chosen once, by ``chosen``
    (``replica_assignment.wait_routed`` awaits it, and so does the first read)."""

    def __init__(self, channels: StepChannels, key: str, start: Start) -> None:
        self._channels = channels
        self.key = key
        self._start = start
        self.handle_response: Any = None
        """The call's own response, which ``replica_assignment.wait_routed`` watches;
        None on a request channel (a replica has it)."""
        self._replica: str | None = None  # the request channel's replica
        self._chose: asyncio.Future[None] | None = None
        self._cancelled = False
        self._decided = not channels.may_send_on_channel()
        if self._decided:  # a call, made now as any handle call is
            self.handle_response = channels._remote(start)
            channels.count_sent("call")
        self._items = self._read()

    async def chosen(self) -> None:
        """Sent: on a request channel, or as a handle call."""
        if self._decided:
            return
        if self._chose is None:
            self._chose = asyncio.ensure_future(self._choose())
        await asyncio.shield(self._chose)

    async def _choose(self) -> None:
        channels = self._channels
        replica = await channels._sent_on_channel(self._start)
        if replica is not None and self._cancelled:
            channels._cancel_on_channel(self.key, replica)
            return
        self._replica = replica
        if replica is None and not self._cancelled:
            self.handle_response = channels._remote(self._start)
        self._decided = True
        channels.count_sent("call" if replica is None else "channel")

    async def _read(self) -> AsyncIterator[Any]:
        channels = self._channels
        try:
            await self.chosen()
            if self._replica is not None:
                try:
                    async for item in channels._on_channel(self.key, self._replica):
                        yield item
                    self._replica = None  # it ended there: nothing to cancel
                    return
                except _RefusedError:
                    # The replica is full: a handle call, which Serve's router queues.
                    channels.count_sent("refused")
                    self._replica = None
                    channels._queues[self.key] = asyncio.Queue()
                    self.handle_response = channels._remote(self._start)
            response = self.handle_response
            if response is None:  # cancelled before it was sent
                return
            async for item in response:
                if isinstance(item, OnChannel):
                    async for event in channels._events(self.key, response, item):
                        yield event
                    return
                yield item
        finally:
            channels._close(self.key)

    def __aiter__(self) -> ChannelStream:
        return self

    async def __anext__(self) -> Any:
        return await anext(self._items)

    def cancel(self) -> None:
        self._cancelled = True
        if self._replica is not None:
            self._channels._cancel_on_channel(self.key, self._replica)
        if self.handle_response is not None:
            self.handle_response.cancel()
        self._channels._close(self.key)


class _RefusedError(Exception):
    """The request channel's replica refused the request (it is full)."""


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


async def _queued(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """A stream's items as its channel's pump queued them, until its end; a failure
    put in its place (the channel or the call broke) is raised."""
    while True:
        item = await queue.get()
        if item is STREAM_END:
            return
        if isinstance(item, _Failed):
            raise item.error
        yield item


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
