"""An inline text stream moved mid-way (``text/inline_move.py``, ``DeliveredText``):
whatever the Ingress had received when its replica was lost, the client's events
carry every token once, in order, and end once.

The derenderer here is a stand-in with the property that matters: its events depend
on the engine's grouping of tokens, and it holds text back across steps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from deployments.messages.replies import RenderedText
from deployments.messages.text_steps import TextResume, TextSteps
from deployments.text.inline_move import StepLog
from deployments.text.sse import PayloadTap, sse_data, sse_stream_payloads
from deployments.transport.migration import DeliveredText

STEPS = [[1], [2], [3, 4], [5], [6], [7], [8, 9], [10]]
TOKENS = [t for step in STEPS for t in step]


def _engine(steps: list[list[int]]) -> list[str]:
    events = []
    for i, step in enumerate(steps):
        finish = "length" if i == len(steps) - 1 else None
        choice = {"index": 0, "token_ids": step, "finish_reason": finish}
        events.append(sse_data({"request_id": "r", "choices": [choice]}))
    return [*events, "data: [DONE]\n\n"]


async def _derender(source: AsyncIterator[str], tap: PayloadTap) -> AsyncGenerator[str, None]:
    """Holds tokens until it has three, then writes them as two events."""
    held: list[int] = []
    async for payload in sse_stream_payloads(source, tap):
        held.extend(payload["choices"][0]["token_ids"])
        if len(held) >= 3:
            yield sse_data({"text": held[:2]})
            yield sse_data({"text": held[2:]})
            held = []
    yield sse_data({"text": held, "end": True})
    yield "data: [DONE]\n\n"


async def _listed(events: list[str]) -> AsyncGenerator[str, None]:
    for event in events:
        yield event


async def _run(resume: TextResume | None, live: list[str]) -> list[Any]:
    """A stream's items from ``live`` engine events, gone on from ``resume`` if given."""
    log = StepLog(resume)
    source = _listed(live) if resume is None else log.replayed(_listed(live), "r", 3)
    return [item async for item in log.tagged(_derender(source, log.saw))]


def _client_tokens(texts: list[str]) -> tuple[list[int], int, int]:
    """(tokens in order, end events, [DONE]s) of what the client got."""
    tokens: list[int] = []
    ends = dones = 0
    for text in texts:
        for part in text.split("\n\n"):
            if part == "data: [DONE]":
                dones += 1
            elif part.startswith("data: "):
                data = json.loads(part[6:])
                tokens += data["text"]
                ends += bool(data.get("end"))
    return tokens, ends, dones


def _moved(progress: DeliveredText) -> TextResume:
    resumed = progress.resumed()
    assert resumed is not None
    (_, resume), before = resumed
    assert isinstance(resume, TextResume) and before == len(resume.token_ids)
    assert resume.token_ids == TOKENS[:before]
    return resume


# The engine's last step comes out with the fifth event: a stream lost after it has
# nothing left to move.
@pytest.mark.parametrize("received", range(1, 5))
@pytest.mark.parametrize("received_after_move", [None, 0, 1, 2])
def test_a_moved_stream_delivers_every_token_once_wherever_it_was_lost(
    received: int, received_after_move: int | None
) -> None:
    first = asyncio.run(_run(None, _engine(STEPS)))
    assert all(isinstance(item, TextSteps) and item.events == 1 for item in first)
    assert first[-1].finished and not first[received - 1].finished
    progress = DeliveredText(RenderedText([], None, False, b"", request_id="r"))
    client = [progress.passed(item) for item in first[:received]]
    # The new engine goes on from there, one token a step (not the first's grouping).
    resume = _moved(progress)
    rest = asyncio.run(_run(resume, _engine([[t] for t in TOKENS[len(resume.token_ids) :]])))
    if received_after_move is not None:  # lost again, after that many items
        client += [progress.passed(item) for item in rest[:received_after_move]]
        if any(item.finished for item in rest[:received_after_move]):
            # Lost after the engine's last step: it does not move (its client gets
            # an error event); the rest as if it had not been lost.
            assert progress.resumed() is None
            rest = rest[received_after_move:]
        else:
            resume = _moved(progress)
            rest = asyncio.run(
                _run(resume, _engine([[t] for t in TOKENS[len(resume.token_ids) :]]))
            )
    client += [progress.passed(item) for item in rest]
    assert _client_tokens(client) == (TOKENS, 1, 1)


def test_a_finished_stream_or_one_sent_as_plain_text_does_not_move() -> None:
    first = asyncio.run(_run(None, _engine(STEPS)))
    progress = DeliveredText(RenderedText([], None, False, b"", request_id="r"))
    for item in first:
        progress.passed(item)
    assert progress.resumed() is None  # the engine ended it
    plain = DeliveredText(RenderedText([], None, False, b"", request_id="r"))
    assert plain.passed("data: {}\n\n") == "data: {}\n\n"
    assert plain.resumed() is None
