"""Step channels, the caller's side: its channel call to each replica it reads
streams from, and each bound stream read as the plain streamed call would be.

The callee's side, and why step channels exist, is ``step_channel.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ray.serve.handle import DeploymentHandle

from deployments.transport.step_channel import (
    STREAM_END,
    ChannelClosedError,
    OnChannel,
)


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
