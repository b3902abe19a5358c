"""Coalesce a tier's SSE events into fewer streamed handle items, and the markers a
step channel's window reads (``NoOutputEvent``, ``is_output``, ``plain``).

The graph's hops are step channels (``step_channel.py``) since the inline one;
per-stream coalescing is what they replaced on Generate → Ingress, kept for
``python -m bench.transport``, which measures each hop shape.

Every item a replica yields through a streamed DeploymentHandle is one Ray
object (~350 µs here), and Serve's replica-to-caller stream has no
backpressure: when the engine outruns the hop, events queue up behind it and
the client falls ever further behind the engine. Consecutive SSE events are
plain strings, so joining them changes nothing a client sees (the same
events, in the same order) while the hop carries one item per batch. An inline
text stream that can move sends ``TextSteps`` (its events with the token ids
they came from), joined the same way.

The first event goes out at once (no TTFT cost). After each item that carries
output, events that arrive within ``window_s`` are held and sent together; a
stream slower than the window is never delayed. An item without output does not
start the window (a ``NoOutputEvent``: the role chunk vLLM opens a chat stream
with; the empty chunk of an engine output whose text a parser holds back, such as
a reasoning model's first token, written when the client asks for every step's
token ids; what a converter writes for them, ``marks_followed``, such as
Anthropic's ``message_start``; a ``ServedBy`` marker). Otherwise the
stream's first text, a step later, waited out the window behind them: at
concurrency 1 the graph's TTFT was 9 ms longer (``python -m bench.requests.ttft``,
docs/ttft-breakdown.md). Anything that is not a string (a
``ServedBy`` marker, an error value, a unary response) goes on its own, in
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from deployments.messages.text_steps import TextSteps


class NoOutputEvent(str):
    """An SSE event that carries none of the stream's output (a chat stream's role
    chunk, an empty delta): it does not start the coalescing window. Joined or
    sent, it leaves as a plain ``str``."""

    __slots__ = ()


class _End:
    """The source finished; ``error`` is what it raised, if anything."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def coalesced(
    source: AsyncGenerator[Any, None], window_s: float | None
) -> AsyncGenerator[Any, None]:
    """``source`` coalesced per ``window_s``; as it is with None (a step channel
    batches it instead)."""
    return source if window_s is None else coalesce_events(source, window_s)


async def coalesce_events(source: AsyncIterator[Any], window_s: float) -> AsyncGenerator[Any, None]:
    """``source``'s items, with runs of ``str`` events joined per ``window_s``."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # re-raised in the consumer, in order
            queue.put_nowait(_End(exc))
        else:
            queue.put_nowait(_End())

    task = asyncio.create_task(pump())
    loop = asyncio.get_running_loop()
    last_sent = -math.inf
    try:
        while True:
            batch = [await queue.get()]
            hold = last_sent + window_s - loop.time()
            if hold > 0 and isinstance(batch[0], (str, TextSteps)):
                await asyncio.sleep(hold)
            while not queue.empty():
                batch.append(queue.get_nowait())
            for item in _joined(batch):
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
            if any(is_output(item) for item in batch):
                last_sent = loop.time()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def marks_followed(
    convert: Callable[[AsyncIterator[str]], AsyncIterator[str]], source: AsyncIterator[str]
) -> AsyncGenerator[str, None]:
    """``convert(source)``'s events, each marked ``NoOutputEvent`` when the source event
    the converter read last was: what a converter writes for a chat stream's role chunk
    (Anthropic's ``message_start``) carries no output either, and must not hold the
    first text behind it."""
    last_marked = False

    async def read() -> AsyncGenerator[str, None]:
        nonlocal last_marked
        async for event in source:
            last_marked = isinstance(event, NoOutputEvent)
            yield event

    async for event in convert(read()):
        yield NoOutputEvent(event) if last_marked else event


def without_output(item: Any) -> bool:
    """Whether ``item`` is marked as carrying none of the stream's output: a
    ``NoOutputEvent``, or ``TextSteps`` of one."""
    text = item.text if isinstance(item, TextSteps) else item
    return isinstance(text, NoOutputEvent)


def is_output(item: Any) -> bool:
    """Whether ``item`` is stream output that starts a window here: an SSE event (or
    ``TextSteps``) not marked ``without_output``."""
    return isinstance(item, (str, TextSteps)) and not without_output(item)


def plain(item: Any) -> Any:
    """``item`` without the ``NoOutputEvent`` marker, as it leaves this process."""
    if isinstance(item, NoOutputEvent):
        return str.__str__(item)
    if isinstance(item, TextSteps) and isinstance(item.text, NoOutputEvent):
        return TextSteps(str.__str__(item.text), item.events, item.steps, item.finished)
    return item


def _kind(item: Any) -> type:
    """What joins with what: any ``str`` (``NoOutputEvent`` included) with a ``str``."""
    return str if isinstance(item, str) else type(item)


def _joined(batch: list[Any]) -> list[Any]:
    """Runs of consecutive strings (or ``TextSteps``) joined into one; everything
    else kept apart: one stream's batch (``joined_by_stream``)."""
    return [item for _, item in joined_by_stream([("", item) for item in batch])]


def joined_by_stream(batch: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """A step channel's batch (``(stream key, item)`` pairs) with each stream's runs of
    consecutive strings (or ``TextSteps``) joined into one item, at the place of the
    run's first; everything else where it was. Each stream keeps its order (the
    caller reads each stream's items apart), and its caller takes, passes on and
    writes one item per run rather than one per engine step."""
    out: list[tuple[str, Any]] = []
    runs: dict[str, _Run] = {}  # each stream's open run, also held in ``out``
    for key, item in batch:
        run = runs.get(key)
        if isinstance(item, (str, TextSteps)):
            if run is not None and _kind(item) is _kind(run[0]):
                run.append(item)
                continue
            runs[key] = run = _Run([item])
            out.append((key, run))
            continue
        runs.pop(key, None)
        out.append((key, item))
    return [(key, _join(item) if isinstance(item, _Run) else item) for key, item in out]


class _Run(list[Any]):
    """A run of one stream's items in ``joined_by_stream``, told apart from an item."""

    __slots__ = ()


def _join(run: list[Any]) -> Any:
    """One item for the run, its text a plain ``str`` (a ``NoOutputEvent`` is a marker
    for this module only)."""
    return "".join(run) if isinstance(run[0], str) else plain(TextSteps.joined(run))
