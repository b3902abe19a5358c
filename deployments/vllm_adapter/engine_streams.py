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

from deployments.vllm_adapter.internals import engine_request_id, live_request_ids

logger = logging.getLogger("ray.serve")

# The streams of the call running ``engine.generate`` right now, if it records them.
_OPENING: ContextVar[list[AsyncGenerator[Any, None]] | None] = ContextVar(
    "scaleout_engine_streams", default=None
)
# Its trace context, for the engine's own span (vLLM's serving classes pass the HTTP
# request's headers, and Generate serves no HTTP request).
_TRACE_HEADERS: ContextVar[dict[str, str] | None] = ContextVar(
    "scaleout_engine_trace", default=None
)


async def abort_held(engine: Any, request_ids: list[str]) -> int:
    """An explicit abort by id: every engine request under these ids ends; returns
    how many this engine held.

    Clients send the id they got back: ``generate-tokens-…`` from
    ``/inference/v1/generate``, ``chatcmpl-…``/``cmpl-…`` from the OpenAI routes.
    Both name the same engine request."""
    engine_ids = sorted({engine_request_id(i) for i in request_ids} | set(request_ids))
    live = live_request_ids(engine)
    held = [i for i in engine_ids if live.get(i)]
    await engine.abort(engine_ids)
    return len(held)


def record_streams(engine: Any) -> None:
    """Make ``engine.generate`` (the ``AsyncLLM`` serving classes call) record each
    stream it returns for the call inside ``EngineCall.opening``, and give it that
    call's trace context."""
    generate = engine.generate

    def generate_recorded(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        trace_headers = _TRACE_HEADERS.get()
        if trace_headers is not None and kwargs.get("trace_headers") is None:
            kwargs["trace_headers"] = trace_headers
        stream: AsyncGenerator[Any, None] = generate(*args, **kwargs)
        opened = _OPENING.get()
        if opened is not None:
            opened.append(stream)
        return stream

    engine.generate = generate_recorded


class EngineCall:
    """The engine streams of one Generate call, and the task that reads them."""

    def __init__(self, movable: bool = True, trace: dict[str, str] | None = None) -> None:
        self._streams: list[AsyncGenerator[Any, None]] = []
        # The context of the engine requests it opens (observability/tracing.py).
        self.trace = trace
        self.task = asyncio.current_task()
        # Whether its caller can make it again elsewhere (EngineCalls.leave), and
        # whether it is inside ``opening`` right now: for a unary call, the whole wait.
        self.movable = movable
        self.awaiting = False

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """Record the streams ``engine.generate`` opens inside this block.

        Only around a plain ``await`` (never across a ``yield``): the variable is
        the task's, and the task runs nothing else of this call meanwhile."""
        token = _OPENING.set(self._streams)
        traced = _TRACE_HEADERS.set(self.trace)
        self.awaiting = True
        try:
            yield
        finally:
            self.awaiting = False
            _TRACE_HEADERS.reset(traced)
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
