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
what comes before the stream (a ``ServedBy`` marker, an error value, a unary
response) and then, instead of the events, where they go (``OnChannel``, with the
stream's first event, so a first token never waits for a channel batch). It
stays open until the stream ends, so that cancelling it (client gone, abort,
caller cancelled) stops the work exactly as before, and so that its failure
(an engine that ends it with an error, a dead replica) reaches the caller.
Per-stream order holds because a stream's events travel on one channel. A
broken channel fails every stream bound to it with the channel's error. In a
batch, a stream's consecutive events (the steps a window held) go as one item,
so its caller takes, passes on and writes one item per batch, not one per step.

This module is the callee's side (outboxes, the bound call); the channel call
is ``channel_source.py``'s, the caller's side ``channel_reader.py``'s. Requests
themselves can ride a channel the other way (``request_channel.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ray.serve.deployment import Deployment

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


class ChannelClosedError(RuntimeError):
    """The caller's channel to this replica broke; the stream cannot be delivered."""


class WrongReplicaError(RuntimeError):
    """A channel call reached a replica other than the one it was opened for."""


async def woken(wake: asyncio.Event) -> bool:
    """Whether ``wake`` was set within ``KEEPALIVE_S``; False: an idle channel's time to
    send an empty batch, which fails once the other end is gone."""
    try:
        async with asyncio.timeout(KEEPALIVE_S):
            await wake.wait()
    except TimeoutError:
        return False
    return True


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

    def put(self, key: str, item: Any, urgent: bool = False) -> None:
        """Queue ``item`` for the channel; ``urgent``: the batch goes at once, as a
        stream's end does (a request's first items, which wait for no window)."""
        if self.closed:
            raise ChannelClosedError("the caller's step channel to this replica is closed")
        if not self._items:
            self._oldest = time.perf_counter()
        self._output = self._output or not without_output(item)
        self._items.append((key, plain(item)))
        if urgent or item is STREAM_END:
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
            if not await woken(self._wake):
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
        self.open_channels = 0
        """Channel calls this replica serves now: Serve counts each as an ongoing
        request, so its routers take them off the queue length (``prefix_router.py``)."""
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
        channel. Raises what ``items`` raises, or if the channel broke."""
        outbox: Outbox | None = None
        self.bound += 1
        try:
            async for item in items:
                if outbox is None:
                    if not isinstance(item, (str, TextSteps)):
                        yield item
                        continue
                    outbox = self.get(caller)
                    yield OnChannel(self._replica, plain(item))
                    continue
                outbox.put(key, item)
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
        self.open_channels += 1
        try:
            async for batch in box.batches(window_s):
                yield batch
        finally:
            self.open_channels -= 1
            box.closed = True
            if self._boxes.get(caller) is box:
                del self._boxes[caller]
