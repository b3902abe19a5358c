"""A Generate stream that outlives its replica: made again elsewhere, from where it was.

The caller of Generate holds every event a stream delivered: a Derender replica for
tier text and ``output_mode: "derender"``, the Ingress for ``output_mode`` ``tokens``
and ``text`` (``migrating_call.py``), and for inline text the engine steps behind
its text (``DeliveredText``, ``text/inline_move.py``). When the call
fails because its replica or engine is gone (``replica_loss.callee_lost``), the
stream goes on as one request to a live replica:

- its prompt is the original prompt followed by the tokens already delivered;
- ``max_tokens`` and ``min_tokens`` shrink by those;
- the request id, the sampling settings and the stop conditions stay;

and the new call's events continue the old ones: its ``usage`` counts the whole
answer against the original prompt, and it does not repeat the prompt's token
ids. At most ``limit`` times per stream; after that, or with no live replica,
the failure ends the stream as before.

A call that failed before it delivered anything (a unary one, most often) is
made again unchanged. What does not carry over to the new replica: a seeded
request's exact random draws, penalties that count earlier output tokens
(frequency, presence), and a stop string that the move splits. Streams with
``n > 1`` or structured output do not move once they delivered tokens (their
state is not the prompt's); docs/engine-death.md.

The delivered events are kept as they came and read only when a stream moves,
so an uneventful stream pays one list append per item.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.messages.replies import RenderedText
from deployments.messages.text_steps import TextResume, TextSteps
from deployments.observability.metrics import graph_metrics
from deployments.transport.replica_loss import callee_lost, lost_engine_replica, raised_in_tier

logger = logging.getLogger("ray.serve")

DONE = "[DONE]"


@dataclass
class Delivered:
    """What a stream's calls delivered, read from their SSE events on demand."""

    events: list[str] = field(default_factory=list)

    def read(self) -> tuple[list[int], bool]:
        """(token ids of choice 0, whether the stream finished)."""
        token_ids: list[int] = []
        finished = False
        for data in _data(self.events):
            if data == DONE:
                finished = True
                continue
            for choice in json.loads(data).get("choices") or ():
                if choice.get("index", 0) == 0:
                    token_ids.extend(choice.get("token_ids") or ())
                    finished = finished or choice.get("finish_reason") is not None
        return token_ids, finished


def continuation(request: Any, delivered: list[int]) -> Any | None:
    """``request`` (a vLLM ``GenerateRequest``, or the body of one as a client sent
    it) resumed after ``delivered`` tokens, or None if its state is more than its
    prompt (see the module's docstring)."""
    if not delivered:
        return request
    if isinstance(request, dict):
        return _body_continuation(request, delivered)
    params = request.sampling_params
    if not resumable(params):
        return None
    params = copy.copy(params)
    if params.max_tokens is not None:
        params.max_tokens -= len(delivered)
        if params.max_tokens < 1:
            return None
    params.min_tokens = max(0, params.min_tokens - len(delivered))
    # Already answered for the original prompt (a stream's go in no event).
    params.prompt_logprobs = None
    return request.model_copy(
        update={"token_ids": [*request.token_ids, *delivered], "sampling_params": params}
    )


def resumable(params: Any) -> bool:
    """Whether a stream with these ``SamplingParams`` can go on from its prompt and the
    tokens it delivered (see the module's docstring)."""
    return bool(params.n == 1 and getattr(params, "structured_outputs", None) is None)


def _body_continuation(body: dict[str, Any], delivered: list[int]) -> dict[str, Any] | None:
    """``continuation`` of a ``/inference/v1/generate`` body that Generate validated
    when the stream began."""
    params = dict(body.get("sampling_params") or {})
    if params.get("n", 1) != 1 or params.get("structured_outputs") is not None:
        return None
    max_tokens = params.get("max_tokens")
    if isinstance(max_tokens, int):
        if max_tokens - len(delivered) < 1:
            return None
        params["max_tokens"] = max_tokens - len(delivered)
    min_tokens = params.get("min_tokens")
    if isinstance(min_tokens, int):
        params["min_tokens"] = max(0, min_tokens - len(delivered))
    params.pop("prompt_logprobs", None)
    return {**body, "token_ids": [*body["token_ids"], *delivered], "sampling_params": params}


class DeliveredText:
    """``Progress`` of an inline text stream, called with ``(rendered, resume)``: the
    Ingress passes on the text of each ``TextSteps`` item and keeps its engine steps,
    from which a Generate replica rebuilds the stream (``messages/text_steps.py``).
    A stream that sends plain text (its Generate replica found it cannot move) does
    not move."""

    def __init__(self, rendered: RenderedText) -> None:
        self._rendered = rendered
        self.request_id = rendered.request_id
        self._resume = TextResume()
        self._movable = False
        self._finished = False

    def passed(self, item: Any) -> Any:
        if not isinstance(item, TextSteps):
            return item
        self._movable = True
        self._resume.steps.extend(item.steps)
        self._resume.events += item.events
        self._finished = item.finished
        return item.text

    def resumed(self) -> tuple[Any, int] | None:
        if not self._movable or self._finished:
            return None
        resume = TextResume(list(self._resume.steps), self._resume.events)
        return (self._rendered, resume), len(resume.token_ids)


def _prompt_and_id(request: Any) -> tuple[int, str]:
    if isinstance(request, dict):
        return len(request.get("token_ids") or ()), str(request.get("request_id"))
    return len(request.token_ids), str(request.request_id)


def continued_event(text: str, prompt_tokens: int, before: int) -> str:
    """A resumed call's SSE event(s) as the original call would have sent them:
    ``usage`` against the original prompt, counting the ``before`` tokens delivered
    earlier; no second ``prompt_token_ids``."""
    if '"usage"' not in text and '"prompt_token_ids"' not in text:
        return text
    parts = text.split("\n\n")
    for i, part in enumerate(parts):
        if not part.startswith("data: {"):
            continue
        data = json.loads(part[6:])
        data.pop("prompt_token_ids", None)
        data.pop("mm_placeholders", None)
        usage = data.get("usage")
        if usage:
            completion = int(usage["completion_tokens"]) + before
            usage.update(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion,
                total_tokens=prompt_tokens + completion,
            )
        parts[i] = "data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return "\n\n".join(parts)


class Progress(Protocol):
    """What a moving stream's calls delivered so far, and where a move goes on from."""

    request_id: str

    def passed(self, item: Any) -> Any:
        """``item`` (one of a call's) as the caller gets it, and recorded."""

    def resumed(self) -> tuple[Any, int] | None:
        """The request that continues the stream and how many tokens came before it,
        or None if it cannot go on (it finished, or its state is not its prompt's)."""


class DeliveredTokens:
    """``Progress`` of a stream of generate SSE events with token ids (``output_mode``
    ``tokens`` or ``text``, the Derender tier's calls): the events are kept as they
    came and read only when the stream moves."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self._prompt_tokens, self.request_id = _prompt_and_id(request)
        self._before = 0
        self.delivered = Delivered()

    def passed(self, item: Any) -> Any:
        if isinstance(item, str):
            if self._before:
                item = continued_event(item, self._prompt_tokens, self._before)
            self.delivered.events.append(item)
        return item

    def resumed(self) -> tuple[Any, int] | None:
        token_ids, finished = self.delivered.read()
        resumed = None if finished else continuation(self._request, token_ids)
        if resumed is None:
            return None
        self._before = len(token_ids)
        return resumed, len(token_ids)


async def migrating(
    call: Callable[[Any, tuple[str, ...]], AsyncGenerator[Any, None]],
    request: Any,
    limit: int,
    progress: Progress | None = None,
) -> AsyncGenerator[Any, None]:
    """``call(request, avoid)``'s items, as ``progress`` passes them on (by default
    ``DeliveredTokens``); when the call fails because its Generate replica or engine
    is gone, the rest of the stream from ``call(resumed, avoid)``, up to ``limit``
    times. ``avoid``: the replicas whose engine died under the stream, which Serve's
    routers list until their actor is gone."""
    progress = progress or DeliveredTokens(request)
    current = request
    moves = 0
    avoid: tuple[str, ...] = ()
    while True:
        try:
            async with contextlib.aclosing(call(current, avoid)) as items:
                async for item in items:
                    yield progress.passed(item)
            return
        except Exception as exc:
            if moves >= limit or not callee_lost(exc):
                raise
            resumed = progress.resumed()
            if resumed is None:
                raise
            moves += 1
            graph_metrics().migrations.inc()
            why = type(raised_in_tier(exc)).__name__
            logger.warning(
                "request %s: its Generate replica was lost (%s) after %d tokens; "
                "continuing on another (move %d of at most %d)",
                progress.request_id, why, resumed[1], moves, limit,
            )  # fmt: skip
            current = resumed[0]
            dead = lost_engine_replica(exc)
            if dead is not None:
                avoid = (*avoid, dead)


def _data(events: list[str]) -> list[str]:
    """The ``data:`` payloads of SSE events, several of which may share one item."""
    return [part[6:] for text in events for part in text.split("\n\n") if part.startswith("data: ")]
