"""A replica that Serve stops (a scale-in, a redeploy, an upgrade), noticed as it starts.

Serve stops a replica by waiting for its ongoing requests, up to the deployment's
``graceful_shutdown_timeout_s``, and then killing it. A replica of this graph has
two kinds of ongoing request that would make that wait go wrong: its streams, which
may run for minutes, and the step channels its callers hold open on it
(``step_channel.py``), which never end by themselves. So a replica watches whether
Serve began to stop it; its work then moves or finishes (each deployment says which:
``EngineCalls.leave``, ``Derender``), and once no stream is bound to its channels they
end, and Serve's wait with them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from deployments.transport.serve_internals import ServeInternalsChanged, draining_probe
from deployments.transport.step_channel import Outboxes

logger = logging.getLogger("ray.serve")


class Endable(Protocol):
    def end(self) -> None: ...


def leaving_probe() -> Callable[[], bool]:
    """Whether Serve is stopping this replica; never, where Serve no longer lets that be
    read (a Ray upgrade): then its streams last only as long as Serve waits."""
    try:
        return draining_probe()
    except ServeInternalsChanged as exc:
        logger.warning("streams cannot move or drain off a replica Serve stops: %s", exc)
        return lambda: False


class LeaveWatch:
    """Polled by the replica's own loop: whether Serve is stopping it, and its step
    channels ended once it is and none of them carries a stream."""

    def __init__(
        self,
        outboxes: Outboxes,
        probe: Callable[[], bool] | None = None,
        ends: Sequence[Endable] = (),
    ) -> None:
        self._outboxes = outboxes
        self._ends = ends  # more channels it ends with its step channels (request channels)
        self._draining = probe or leaving_probe()
        self.leaving = False

    def poll(self, busy: bool) -> bool:
        """True the first time Serve is seen stopping this replica. ``busy``: whether
        the replica still holds work that ends up on its channels."""
        if not self.leaving:
            self.leaving = self._draining()
            return self.leaving
        if not busy:
            self._outboxes.end()
            for channels in self._ends:
                channels.end()
        return False
