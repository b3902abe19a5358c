"""Request channels: requests between tiers as items on a call already open, the way a
stream's events already travel on step channels (``step_channel.py``).

A handle call per request costs, on both ends, Serve's router, a gRPC message,
the replica's call intake (its request context, metrics and access-log hooks),
tasks and a pickle: more CPU per request on a Generate replica than vLLM's
whole API server spends (issue 66). Once a caller replica holds a step channel
on a callee replica, the callee opens the way back: a streamed call to the
caller (``request_channel``, pinned to it by ``PinnedRouter``) whose items are
the requests the caller has for it, every request of one event-loop turn in one
item. The callee runs each as the per-request call would have run (the same
``*_on_channel`` method) and puts everything it yields on the step channel,
the items that come before a stream (a ``ServedBy`` marker, an error value, a
unary answer) and an exception it raises included (``Raised``), so the caller
reads the request as it reads a call.

Serve still decides where each request goes: the caller asks the deployment's
router to pick a replica (``serve_internals.pick_replica``), and sends on that
replica's channel only if it has one open; otherwise, and for a callee that
refuses it (full: ``Refused``), the request is a handle call as before, which
Serve's router queues, sheds (``max_queued_requests``) or sends to a replica
that has no channel yet. Cancelling a request sends ``Cancel``; a caller whose
channel breaks (its replica died) has its requests cancelled by the callee; a
callee that dies breaks its step channel, which fails every request bound to it.

This module holds the messages, the caller's side (``Inboxes``, served by
``RequestChannelSink.request_channel``) and the callee's (``RequestReader``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from deployments.transport.serve_internals import RequestFields, enter_serve_request
from deployments.transport.step_channel import (
    STREAM_END,
    ChannelClosedError,
    OnChannel,
    WrongReplicaError,
    woken,
)

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Start:
    """Run ``method(*args, caller, key, **kwargs)`` and put what it yields under ``key``."""

    key: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    request: RequestFields = ("", "", "")
    """The caller's Serve request context, which the callee runs it in."""


@dataclass(frozen=True)
class Cancel:
    """The caller no longer reads request ``key``: end it as a cancelled call ends."""

    key: str


@dataclass(frozen=True)
class Raised:
    """What a request's method raised, in its place on the step channel."""

    error: BaseException


@dataclass(frozen=True)
class Refused:
    """The callee took no work for this request (it runs as many as Serve lets a
    replica run): the caller makes it a handle call, which Serve's router queues."""


class Inbox:
    """A caller's requests for one callee replica, drained by that replica's
    ``request_channel`` call."""

    def __init__(self) -> None:
        self._items: list[Start | Cancel] = []
        self._wake = asyncio.Event()
        self.closed = False
        self.on_unsent: Callable[[Start], None] = lambda _: None
        """Told of each request the channel never sent (it ended first)."""

    def put(self, message: Start | Cancel) -> None:
        if self.closed:
            raise ChannelClosedError("the request channel to this replica is closed")
        self._items.append(message)
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def batches(self) -> AsyncIterator[list[Start | Cancel]]:
        """Every message put since the last batch, one list per wake-up: one
        ``sleep(0)`` first lets every request of the turn that woke it join."""
        try:
            while not self.closed:
                if not await woken(self._wake):
                    yield []  # fails once the callee is gone, which ends the channel
                    continue
                await asyncio.sleep(0)
                if self.closed:  # what waits is reported unsent (``on_unsent``)
                    break
                self._wake.clear()
                items, self._items = self._items, []
                if items:
                    yield items
        finally:
            self.closed = True
            unsent, self._items = self._items, []
            for message in unsent:
                if isinstance(message, Start):
                    self.on_unsent(message)


class Inboxes:
    """The caller replica's side: an inbox per callee replica whose channel is open."""

    def __init__(self, replica: str) -> None:
        self._replica = replica
        self._boxes: dict[str, Inbox] = {}

    def get(self, callee: str) -> Inbox | None:
        """The open inbox for ``callee``, if its channel is open."""
        box = self._boxes.get(callee)
        return None if box is None or box.closed else box

    def any_open(self) -> bool:
        return bool(self._boxes)

    def close(self, callee: str) -> None:
        """No more requests for ``callee`` (its step channel ended)."""
        box = self._boxes.pop(callee, None)
        if box is not None:
            box.close()

    def end(self) -> None:
        """End every channel (this replica is leaving and holds no stream)."""
        for callee in list(self._boxes):
            self.close(callee)

    async def serve(
        self, callee: str, replica: str, on_unsent: Callable[[Start], None]
    ) -> AsyncIterator[list[Start | Cancel]]:
        """The ``request_channel`` call's body: ``callee``'s requests, batched."""
        if replica != self._replica:
            raise WrongReplicaError(
                f"request channel for replica {replica} reached {self._replica}"
            )
        self.close(callee)  # a channel the callee opens again replaces the old one
        box = self._boxes[callee] = Inbox()
        box.on_unsent = on_unsent
        try:
            async for batch in box.batches():
                yield batch
        finally:
            if self._boxes.get(callee) is box:
                del self._boxes[callee]


class RequestChannelSink:
    """A caller deployment whose callees send for its requests: it keeps ``Inboxes``
    and serves the ``request_channel`` call (``PinnedRouter`` routes it here by
    ``replica``)."""

    _inboxes: Inboxes
    _on_unsent: Callable[[Start], None]

    async def request_channel(self, callee: str, replica: str) -> AsyncIterator[Any]:
        async for batch in self._inboxes.serve(callee, replica, self._on_unsent):
            yield batch


# Runs one request on the callee: ``(message, caller)`` → the items its method yields.
Runner = Callable[[Start, str], AsyncIterator[Any]]


class RequestReader:
    """The callee's side of one caller's request channel: reads it and runs each
    request, its items put under its key in the caller's outbox (``put``)."""

    def __init__(
        self,
        call: Callable[[], Any],
        caller: str,
        run: Runner,
        put: Callable[[str, Any, bool], None],
        admits: Callable[[], bool],
    ) -> None:
        self._caller = caller
        self._run = run
        self._put = put
        self._admits = admits
        self.running: dict[str, asyncio.Task[None]] = {}
        self.bound = 0
        """Of ``running``, those whose stream is bound to the step channel (``Outboxes.bound``
        counts them too)."""
        # Outside any request: the channel is this replica's, not a call's.
        detached = contextvars.Context()
        self._task = detached.run(asyncio.create_task, self._read(call))

    async def _read(self, call: Callable[[], Any]) -> None:
        try:
            async for batch in call():
                for message in batch:
                    if isinstance(message, Start):
                        self._start(message)
                    else:
                        task = self.running.get(message.key)
                        if task is not None:
                            task.cancel()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the caller died: nobody reads what runs for it
            logger.info("request channel from %s ended: %r", self._caller, exc)
            self.cancel_all()

    def _start(self, message: Start) -> None:
        if not self._admits():
            self._put(message.key, Refused(), True)
            return
        detached = contextvars.Context()
        task = detached.run(asyncio.create_task, self._request(message))
        self.running[message.key] = task

    async def _request(self, message: Start) -> None:
        bound = False
        try:
            enter_serve_request(message.request)  # this task's own context
            # What comes before a stream, and its first event, go at once (a call's
            # first items wait for no window); the rest the method puts itself.
            async for item in self._run(message, self._caller):
                if isinstance(item, OnChannel):
                    bound = True
                    self.bound += 1
                    self._put(message.key, item.first, True)
                else:
                    self._put(message.key, item, True)
            if not bound:
                self._put(message.key, STREAM_END, True)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            with contextlib.suppress(ChannelClosedError):
                self._put(message.key, Raised(exc), True)
        finally:
            self.running.pop(message.key, None)
            if bound:
                self.bound -= 1

    def cancel_all(self) -> None:
        for task in list(self.running.values()):
            task.cancel()

    def stop(self) -> None:
        self._task.cancel()
        self.cancel_all()
