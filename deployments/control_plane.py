"""The control plane: what reaches every replica of the data plane.

Its Serve deployment keeps the name users know, ``AbortFanout``. A request can
be on any Generate replica, and a stateful text stream on any Derender replica,
so ``/inference/v1/abort_requests`` goes to all of them. The engine that holds
a request aborts it, and its stream ends with ``finish_reason: "abort"``
through whichever placement carries it. Unknown or finished ids are a no-op.
The same fan-out reads each engine's state for ``/metrics`` and tells
``/health`` which tiers are up.

Commands travel down each replica's own subscription (``control_channel``),
not as calls into the replica, so a replica whose streams fill its
``max_ongoing_requests`` still takes them at once.

Its Serve options, and the import path Serve loads this class by, are declared
in ``deployments/declarations/control_plane.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayActorError

from deployments.config.serve_env import missing_switches, switches_warning
from deployments.messages.control import CommandKind, ControlCommand, EngineState, HostLoad, Tier
from deployments.observability.metrics import configure_metrics, graph_metrics
from deployments.transport.serve_internals import ping_actor

logger = logging.getLogger("ray.serve")

# A replica whose answer is this late is checked for life: Ray does not end a
# subscription whose replica died, so without the check a killed replica would
# hold up the next command for the whole timeout.
GONE_CHECK_AFTER_S = 0.5
# A live replica that does not answer within this long is dropped too, and its
# stream ends, so a stalled one subscribes afresh.
REPLY_TIMEOUT_S = 10.0


@dataclass
class _Subscriber:
    queue: asyncio.Queue[ControlCommand | None] = field(default_factory=asyncio.Queue)
    """Commands for the replica; ``None`` ends its stream."""
    actor: Any = None
    """The replica's Ray actor handle, to tell a dead replica from a slow one."""


class ControlPlane:
    """Abort, ``/metrics`` and ``/health`` across every Generate and Derender replica."""

    def __init__(self, metrics: bool = True) -> None:
        configure_metrics(metrics)  # GraphConfig.observability.metrics
        # One replica per graph, started by its node's raylet as every replica is: its
        # environment is what Ray's processes there started with.
        if missing := missing_switches(os.environ):
            logger.warning(switches_warning(missing))
        self._subscribers: dict[tuple[Tier, str], _Subscriber] = {}
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)

    async def subscribe(
        self, tier: Tier, replica: str, actor: Any = None
    ) -> AsyncIterator[ControlCommand]:
        """A replica's control channel: ``subscribed``, then every command for it."""
        key = (tier, replica)
        subscriber = _Subscriber(actor=actor)
        self._drop(key)  # the same replica subscribing again: its old stream is over
        self._subscribers[key] = subscriber
        try:
            yield ControlCommand(id=0, kind="subscribed")
            while (command := await subscriber.queue.get()) is not None:
                yield command
        finally:
            if self._subscribers.get(key) is subscriber:
                del self._subscribers[key]

    async def reply(self, command_id: int, result: Any) -> None:
        """A replica's answer to one command."""
        future = self._pending.get(command_id)
        if future is not None and not future.done():
            future.set_result(result)

    async def abort(self, request_ids: list[str]) -> dict[str, int]:
        """Abort on every Generate replica; count the streams each tier held."""
        # Side by side: an aborted stream leaves its Derender replica within
        # milliseconds, so asking afterwards would find nothing held.
        aborted, held = await asyncio.gather(
            self._ask("generate", "abort", request_ids),
            self._ask("derender", "abort", request_ids),
        )
        counts = {"generate": sum(_ints(aborted)), "derender": sum(_ints(held))}
        logger.info("abort of %d id(s): held %s", len(request_ids), counts)
        metrics = graph_metrics()
        if request_ids:
            metrics.abort_ids.inc(len(request_ids))
        if counts["generate"]:
            metrics.aborted_requests.inc(counts["generate"])
        return counts

    async def end_calls(self, keys: list[str]) -> int:
        """End the Generate calls bound under these step-channel keys (their caller,
        a Derender replica, died); how many were running."""
        return sum(_ints(await self._ask("generate", "abort_calls", keys)))

    async def engine_states(self) -> list[EngineState]:
        """Every Generate replica's engine state (``/metrics``)."""
        states = await self._ask("generate", "engine_state", [])
        return [s for s in states if isinstance(s, EngineState)]

    async def host_loads(self) -> list[HostLoad]:
        """Every Generate and Derender replica's host load (``text_placement: auto``);
        a replica with no window yet gives none."""
        loads = await asyncio.gather(
            self._ask("generate", "host_load", []), self._ask("derender", "host_load", [])
        )
        return [load for tier in loads for load in tier if isinstance(load, HostLoad)]

    async def subscribed(self) -> dict[str, int]:
        """Live replicas subscribed per tier (``/health``); dead ones are dropped here."""
        subscribers = list(self._subscribers.items())
        gone = await asyncio.gather(*(_gone(s.actor) for _, s in subscribers))
        counts = {"generate": 0, "derender": 0}
        for (key, subscriber), dead in zip(subscribers, gone, strict=True):
            if not dead:
                counts[key[0]] += 1
            elif self._subscribers.get(key) is subscriber:
                logger.warning("%s replica %s is gone; dropping it", *key)
                self._drop(key)
        return counts

    async def ready(self) -> bool:
        return True

    async def _ask(self, tier: Tier, kind: CommandKind, request_ids: list[str]) -> list[Any]:
        """Send one command to every replica of a tier; the answers of those that gave one."""
        asked = []
        loop = asyncio.get_running_loop()
        for key, subscriber in list(self._subscribers.items()):
            if key[0] != tier:
                continue
            command = ControlCommand(id=next(self._ids), kind=kind, request_ids=request_ids)
            future: asyncio.Future[Any] = loop.create_future()
            self._pending[command.id] = future
            subscriber.queue.put_nowait(command)
            asked.append((key, subscriber, command.id, future))
        answered = await asyncio.gather(*(_answered(s, f) for _, s, _, f in asked))
        answers = []
        for (key, subscriber, command_id, future), ok in zip(asked, answered, strict=True):
            self._pending.pop(command_id, None)
            if ok:
                answers.append(future.result())
            elif self._subscribers.get(key) is subscriber:
                logger.warning("%s replica %s did not answer %s; dropping it", *key, kind)
                self._drop(key)
        return answers

    def _drop(self, key: tuple[Tier, str]) -> None:
        subscriber = self._subscribers.pop(key, None)
        if subscriber is not None:
            subscriber.queue.put_nowait(None)


async def _answered(subscriber: _Subscriber, future: asyncio.Future[Any]) -> bool:
    """Whether the replica answered: soon, or, while it is alive, within the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REPLY_TIMEOUT_S
    done, _ = await asyncio.wait({future}, timeout=GONE_CHECK_AFTER_S)
    if done:
        return True
    if subscriber.actor is not None:
        gone = asyncio.ensure_future(_gone(subscriber.actor))
        done, _ = await asyncio.wait(
            {future, gone}, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
        )
        if future in done:
            gone.cancel()
            return True
        if gone in done and gone.result():
            return False
        gone.cancel()
    done, _ = await asyncio.wait({future}, timeout=max(0.0, deadline - loop.time()))
    return bool(done)


async def _gone(actor: Any) -> bool:
    """Whether the replica's actor has died: a live one answers Ray's own ping, which
    Serve does not count against ``max_ongoing_requests``. Unknown (no handle, or no
    answer in time) counts as alive."""
    if actor is None:
        return False
    try:
        await asyncio.wait_for(_ping(actor), REPLY_TIMEOUT_S)
    except RayActorError:
        return True
    except TimeoutError:
        return False
    return False


async def _ping(actor: Any) -> None:
    await ping_actor(actor)


def _ints(results: list[Any]) -> list[int]:
    """Answers that came back as counts."""
    return [r for r in results if isinstance(r, int)]
