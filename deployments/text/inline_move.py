"""Generate's side of an inline text stream that moves (``messages/text_steps.py``).

A stream that can move sends ``TextSteps``: each event the stream derenderer
writes, with the token ids of the engine outputs it read since the event before.
An output's ids go with the first event written after the derenderer read it, so
the Ingress never holds ids without the events the derenderer wrote from them
before that. Text the derenderer holds back across outputs (a stop string's
prefix, a character split over tokens, a tool call being parsed) is state, not
an event: a replay of the same steps holds it back again.

A Generate replica that continues the stream feeds the steps the Ingress kept
into a fresh derenderer, in the engine's own grouping, so that it ends in the
lost one's state; drops the first ``resume.events`` events the replay writes
(the client has them); sends on the rest (written from those steps, lost on the
way); and then derenders the engine's continuation as the lost replica would
have.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from deployments.messages.text_steps import TextResume, TextSteps
from deployments.messages.tier import TextJob
from deployments.transport.migration import continued_event, resumable

logger = logging.getLogger("ray.serve")


def inline_movable(job: TextJob) -> bool:
    """Whether an inline stream of ``job`` can move: one prompt, one choice, no
    structured output (``transport/migration.py``), and not Responses (vLLM names
    its output items at random, so a replay would name them anew)."""
    request = job.generate_request
    return bool(
        request.stream
        and job.batch is None
        and job.api != "responses"
        and resumable(request.sampling_params)
    )


class StepLog:
    """The engine steps behind one inline stream's events, and its replay on a move."""

    def __init__(self, resume: TextResume | None = None) -> None:
        self._steps: list[list[int]] = []
        self._finished = False
        self._resume = resume
        # Events of the replay the client already has.
        self._drop = 0 if resume is None else resume.events
        self._replaying = resume is not None

    def saw(self, payload: dict[str, Any]) -> None:
        """A ``PayloadTap``: each generate payload the derenderer reads."""
        if self._replaying:
            return
        for choice in payload.get("choices") or ():
            if choice.get("index", 0) == 0:
                self._steps.append(choice.get("token_ids") or [])
                self._finished = self._finished or choice.get("finish_reason") is not None

    async def tagged(self, events: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
        """The derenderer's events as ``TextSteps``, less those the client has."""
        async for event in events:
            if not isinstance(event, str):
                yield event
                continue
            if self._drop:
                if self._replaying:
                    self._drop -= 1
                    continue
                # Cannot happen with a derenderer that writes the same events for the
                # same steps; sent rather than lost if it did.
                logger.warning("a moved inline stream's replay wrote %d events fewer than "
                               "its client had", self._drop)  # fmt: skip
                self._drop = 0
            steps, self._steps = self._steps, []
            yield TextSteps(event, 1, steps, self._finished)

    async def replayed(
        self, live: AsyncIterator[str], request_id: str, prompt_tokens: int
    ) -> AsyncGenerator[str, None]:
        """A moved stream's generate events to derender: the replay of the steps the
        client has, then the engine's continuation (``live``), its usage counted
        against the original prompt and the tokens before it."""
        resume = self._resume
        assert resume is not None, "a stream that did not move derenders its engine's events"
        for step in resume.steps:
            choice = {"index": 0, "token_ids": step}
            yield f"data: {json.dumps({'request_id': request_id, 'choices': [choice]})}\n\n"
        self._replaying = False
        before = len(resume.token_ids)
        async for event in live:
            yield continued_event(event, prompt_tokens, before)
