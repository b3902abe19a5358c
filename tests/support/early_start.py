"""A server a test package will need, started beside the package's graph.

Starting a graph and starting vLLM's own server each spend part of their time
waiting rather than computing (Ray's and Serve's control loops, health checks,
processes spawned one after another), so started together they take less wall time
than one after the other. A server is started early only when a test collected
for this run uses it; what the tests compare with it is unchanged.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

import pytest

T = TypeVar("T")


class EarlyStart(Generic[T]):
    """A context manager entered in a thread now; its value awaited later; exited at
    ``close`` (after its start, whether that succeeded or not)."""

    def __init__(self, manager: contextlib.AbstractContextManager[T]) -> None:
        self._stack = contextlib.ExitStack()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="early-start")
        self._started = self._pool.submit(self._stack.enter_context, manager)

    def get(self) -> T:
        """The started server (its start's error, if it failed)."""
        return self._started.result()

    def close(self) -> None:
        try:
            self._started.exception()  # waits for the start to end either way
        finally:
            self._stack.close()
            self._pool.shutdown()


def collected_use(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test collected for this run uses ``fixture``."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)
