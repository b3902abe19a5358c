"""One call shared by every concurrent caller, its answer reused for a moment.

``/health`` and ``/metrics`` are open, as in vLLM, and each fans out to every
replica of the graph (``ControlPlane``). A client that polls them in a loop would
make every replica answer every poll. Behind this, concurrent requests share one
fan-out (and, with ``ttl_s`` above 0, its answer serves that long too): however
many clients poll at once, one fan-out at a time is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedCall(Generic[T]):
    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._task: asyncio.Task[T] | None = None
        self._answered_at = -float("inf")

    async def get(self, call: Callable[[], Awaitable[T]]) -> T:
        """The answer of a ``call()`` started at most ``ttl_s`` ago, or of a new one.

        A failed call is not reused: the next caller starts another."""
        loop = asyncio.get_running_loop()
        task = self._task
        fresh = task is not None and (
            not task.done() or loop.time() - self._answered_at < self._ttl_s
        )
        failed = task is not None and task.done() and (task.cancelled() or task.exception())
        if task is None or not fresh or failed:
            task = self._task = asyncio.ensure_future(call())
            task.add_done_callback(self._answered)
        # Shielded: one caller that goes away does not cancel the others' answer.
        return await asyncio.shield(task)

    def _answered(self, task: asyncio.Task[T]) -> None:
        self._answered_at = asyncio.get_running_loop().time()
        if not task.cancelled():
            task.exception()  # retrieved, so a failure is not logged as never awaited
