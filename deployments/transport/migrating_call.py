"""A streamed handle call to Generate that moves when its replica is lost, read as the
handle response it starts with.

The Ingress streams ``output_mode`` ``tokens`` and ``text`` straight from Generate
(``/inference/v1/generate``), and inline text; ``edge/tier_calls.respond`` reads such a call as a
handle response: it watches the first call until a replica takes it, then iterates
it and cancels it when the client goes. :class:`MigratingCall` is that response,
moved as ``migration.migrating`` moves a stream: each later call is watched the
same way (no live replica to move to ends the stream, after ``patience_s``, rather
than a wait without end in Serve's router for one to start).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from ray.serve.handle import DeploymentHandle

from deployments.transport.migration import Progress, migrating
from deployments.transport.replica_assignment import wait_routed


class NoReplicaToMoveToError(RuntimeError):
    """A stream's Generate replica was lost and no other is running."""


class MigratingCall:
    """``call(body, avoid)``'s stream, moved up to ``limit`` times; ``avoid`` for the
    first call (replicas an earlier try saw die); ``progress`` as ``migrating`` takes it."""

    def __init__(
        self,
        call: Callable[[Any, tuple[str, ...]], Any],
        body: Any,
        limit: int,
        via: DeploymentHandle[Any],
        avoid: tuple[str, ...] = (),
        patience_s: float = 0.0,
        progress: Progress | None = None,
    ) -> None:
        self._call = call
        self._via = via
        self._patience_s = patience_s
        self.handle_response = call(body, avoid)
        """The current call's own response, which ``replica_assignment.wait_routed`` watches."""
        self._first: Any = self.handle_response
        self._items = migrating(self._each, body, limit, progress)

    async def _each(self, body: Any, avoid: tuple[str, ...]) -> AsyncGenerator[Any, None]:
        response, self._first = self._first, None
        if response is None:  # a move
            response = self.handle_response = self._call(body, avoid)
            try:
                routed = await wait_routed(response, self._via, self._patience_s)
            except BaseException:  # cancelled while it waits: the client went away
                response.cancel()
                raise
            if not routed:
                response.cancel()
                raise NoReplicaToMoveToError("no Generate replica is running to move to")
        try:
            async for item in response:
                yield item
        finally:
            response.cancel()

    def __aiter__(self) -> MigratingCall:
        return self

    async def __anext__(self) -> Any:
        return await anext(self._items)

    def cancel(self) -> None:
        self.handle_response.cancel()
