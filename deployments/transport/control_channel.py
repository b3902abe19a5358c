"""A data-plane replica's control channel: commands in on a stream it opened itself.

Serve counts every call into a replica, broadcasts included, against its
``max_ongoing_requests``. A Generate replica that is full (its streams hold
every slot) would take an abort or a ``/metrics`` read only once one of those
streams ended: an abort of the stream filling the replica could never land.
So each Generate and Derender replica opens one long-lived stream to
``ControlPlane`` (``subscribe``) when it starts, and the fan-out sends its
commands down that stream. The replica answers each with a unary
``ControlPlane.reply``; neither direction needs a slot in the replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.serve.handle import DeploymentHandle

from deployments.messages.control import ControlCommand, Tier

logger = logging.getLogger("ray.serve")

RESUBSCRIBE_DELAY_S = 0.5
# A replica starts serving only once subscribed, or an abort could miss it.
CONTROL_SUBSCRIBE_TIMEOUT_S = 120.0

Handler = Callable[[ControlCommand], Awaitable[Any]]


class ControlChannel:
    """Keeps one replica subscribed to the control plane, resubscribing if the stream ends."""

    def __init__(self, control: DeploymentHandle, tier: Tier, replica: str, handler: Handler):
        self._control = control
        self._stream_handle = control.options(stream=True)
        self._tier = tier
        self._replica = replica
        self._handler = handler
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._commands: Any = None  # the subscription call in flight
        self._answers: set[asyncio.Task[None]] = set()

    async def start(self, timeout_s: float) -> None:
        """Subscribe, and return once the control plane has this replica."""
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._subscribed.wait(), timeout_s)

    def stop(self) -> None:
        """End the subscription now, so the control plane forgets this replica at once."""
        if self._task is not None:
            self._task.cancel()
        if self._commands is not None:
            self._commands.cancel()

    async def _run(self) -> None:
        while True:
            try:
                self._commands = self._stream_handle.subscribe.remote(
                    self._tier, self._replica, ray.get_runtime_context().current_actor
                )
                async for command in self._commands:
                    if command.kind == "subscribed":
                        self._subscribed.set()
                        continue
                    # Answered on the side: a slow answer must not hold up the next command.
                    task = asyncio.create_task(self._answer(command))
                    self._answers.add(task)
                    task.add_done_callback(self._answers.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control plane restarting, or this replica stopping
                logger.warning("control channel of %s lost: %r", self._replica, exc)
            await asyncio.sleep(RESUBSCRIBE_DELAY_S)

    async def _answer(self, command: ControlCommand) -> None:
        try:
            result = await self._handler(command)
        except Exception as exc:
            logger.exception("control command %s failed: %r", command.kind, exc)
            result = None  # the fan-out skips it, as it skips a replica that did not answer
        try:
            await self._control.reply.remote(command.id, result)
        except Exception as exc:
            logger.warning("control reply %s lost: %r", command.id, exc)
