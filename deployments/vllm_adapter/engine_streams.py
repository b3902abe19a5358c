"""Which engine requests each Generate call opened, so its cleanup ends only those.

vLLM names an engine request by the id its caller gives and adds a random
suffix inside (``InputProcessor.assign_request_id``); ``AsyncLLM.abort(id)``
expands a caller's id to every request under it. Two clients that send the
same ``request_id`` share that name, so a cleanup that aborts by it ends the
other client's stream too. vLLM's own servers never clean up by name: the
``AsyncLLM.generate`` stream aborts its own suffixed request when it is closed
or cancelled. This does the same: each stream a call opens is recorded for
that call (``opening``), and the call's cleanup closes them (``close``). An
explicit abort by id (``/inference/v1/abort_requests``) still goes by name and
reaches every request the client named, as vLLM's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator
from contextvars import ContextVar
from typing import Any

logger = logging.getLogger("ray.serve")

# The streams of the call running ``engine.generate`` right now, if it records them.
_OPENING: ContextVar[list[AsyncGenerator[Any, None]] | None] = ContextVar(
    "scaleout_engine_streams", default=None
)


def record_streams(engine: Any) -> None:
    """Make ``engine.generate`` (the ``AsyncLLM`` serving classes call) record each
    stream it returns for the call inside ``EngineCall.opening``."""
    generate = engine.generate

    def generate_recorded(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        stream: AsyncGenerator[Any, None] = generate(*args, **kwargs)
        opened = _OPENING.get()
        if opened is not None:
            opened.append(stream)
        return stream

    engine.generate = generate_recorded


class EngineCall:
    """The engine streams of one Generate call, and the task that reads them."""

    def __init__(self, movable: bool = True) -> None:
        self._streams: list[AsyncGenerator[Any, None]] = []
        self.task = asyncio.current_task()
        # Whether its caller can make it again elsewhere (Generate._leave), and
        # whether it is inside ``opening`` right now: for a unary call, the whole wait.
        self.movable = movable
        self.awaiting = False

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """Record the streams ``engine.generate`` opens inside this block.

        Only around a plain ``await`` (never across a ``yield``): the variable is
        the task's, and the task runs nothing else of this call meanwhile."""
        token = _OPENING.set(self._streams)
        self.awaiting = True
        try:
            yield
        finally:
            self.awaiting = False
            _OPENING.reset(token)

    async def close(self) -> None:
        """Close what this call opened: vLLM's stream aborts its own request
        (a finished stream: nothing). Streams are emptied in place, since a task
        started inside ``opening`` (vLLM's output handler) keeps the list."""
        streams = list(self._streams)
        self._streams.clear()
        for stream in streams:
            try:
                await stream.aclose()
            except RuntimeError:
                # Read by another task right now: cancelling that task aborts it.
                pass
            except Exception as exc:  # a dead engine cannot abort; nothing runs there
                logger.debug("closing an engine stream failed: %r", exc)

    def cancel(self) -> None:
        """End the call from outside (its caller died): its reader's cancellation
        reaches vLLM's stream, which aborts its own request."""
        if self.task is not None:
            self.task.cancel()
