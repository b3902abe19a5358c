"""Handle results to HTTP: when a tier's failure triggers cleanup, and when not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi.responses import StreamingResponse
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from deployments.edge.tier_calls import RETRIES_ON_REPLICA_LOSS, respond
from deployments.messages.replies import ServedBy, TierFailure, error_reply
from deployments.text.sse import DONE, sse_data
from deployments.transport.replica_loss import EngineLostError


class Call:
    """A streamed handle call: yields ``items``, then raises ``error`` if set."""

    def __init__(self, items: list[Any], error: Exception | None = None) -> None:
        self._items = iter(items)
        self._error = error
        self.cancelled = False

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> Any:
        for item in self._items:
            return item
        if self._error is not None:
            raise self._error
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class Tier:
    """A handle whose router state Serve has not filled in: every call counts as taken."""

    deployment_name = "Generate"


async def body_of(
    call: Call | list[Call], failures: list[str], avoided: list[tuple[str, ...]] | None = None
) -> tuple[int, str]:
    """The response to ``call``, or to each call of the list in turn as calls are made;
    each call's ``avoid`` goes to ``avoided``."""
    calls = iter(call if isinstance(call, list) else [call])

    def start(avoid: tuple[str, ...]) -> Call:
        if avoided is not None:
            avoided.append(avoid)
        return next(calls)

    response = await respond(start, Tier(), on_failure=lambda _: failures.append("cleanup"))
    if not isinstance(response, StreamingResponse):
        return response.status_code, bytes(response.body).decode()
    chunks = [c if isinstance(c, str) else bytes(c).decode() async for c in response.body_iterator]
    return response.status_code, "".join(chunks)


def test_a_tier_dying_mid_stream_ends_the_stream_and_triggers_cleanup() -> None:
    failures: list[str] = []
    call = Call([sse_data({"i": 0})], ActorDiedError())
    status, body = asyncio.run(body_of(call, failures))
    assert status == 200
    events = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert json.loads(events[0]) == {"i": 0}
    assert json.loads(events[1])["error"]["code"] == 503
    assert events[2] == DONE
    assert failures == ["cleanup"]
    assert call.cancelled


def test_a_stream_that_ends_well_triggers_no_cleanup() -> None:
    failures: list[str] = []
    status, body = asyncio.run(body_of(Call([sse_data({"i": 0}), sse_data(DONE)]), failures))
    assert status == 200 and body.endswith(f"data: {DONE}\n\n")
    assert failures == []


def test_overload_before_the_first_item_is_a_503_without_cleanup() -> None:
    failures: list[str] = []
    overloaded = Call([], BackPressureError(num_queued_requests=2, max_queued_requests=1))
    status, body = asyncio.run(body_of(overloaded, failures))
    assert status == 503 and json.loads(body)["error"]["code"] == 503
    assert failures == []


def test_a_replica_lost_before_the_first_item_is_called_again() -> None:
    """Nothing reached the client, so the call is made again: the client reads the
    second call's stream; the lost one is cleaned up and cancelled."""
    for lost in (ActorDiedError(), ActorUnavailableError("unavailable", None)):
        failures: list[str] = []
        calls = [Call([], lost), Call([sse_data({"i": 1}), sse_data(DONE)])]
        status, body = asyncio.run(body_of(calls, failures))
        assert status == 200 and body.startswith(sse_data({"i": 1})), body
        assert failures == ["cleanup"]
        assert calls[0].cancelled


def test_a_call_its_engine_ended_before_the_first_item_is_called_again_elsewhere() -> None:
    """The replica whose engine died is still listed by Serve's router for a moment:
    the next call asks the router to keep away from it."""
    avoided: list[tuple[str, ...]] = []
    calls = [Call([], EngineLostError("r1")), Call([sse_data({"i": 1}), sse_data(DONE)])]
    status, body = asyncio.run(body_of(calls, [], avoided))
    assert status == 200 and body.startswith(sse_data({"i": 1})), body
    assert avoided == [(), ("r1",)]


def test_a_replica_lost_before_the_first_item_every_time_is_a_503_with_cleanup() -> None:
    failures: list[str] = []
    calls = [Call([], ActorDiedError()) for _ in range(RETRIES_ON_REPLICA_LOSS + 2)]
    status, _ = asyncio.run(body_of(calls, failures))
    assert status == 503
    assert failures == ["cleanup"] * (RETRIES_ON_REPLICA_LOSS + 1)
    assert [c.cancelled for c in calls] == [True] * (RETRIES_ON_REPLICA_LOSS + 1) + [False]


def test_a_failure_that_is_not_a_lost_replica_is_not_called_again() -> None:
    """Overload and a tier that failed (not a lost replica) each answer at once."""
    for error in (
        BackPressureError(num_queued_requests=2, max_queued_requests=1),
        TierFailure("RuntimeError: boom"),
    ):
        calls = [Call([], error), Call([sse_data({"i": 1})])]
        status, _ = asyncio.run(body_of(calls, []))
        assert status == 503, (error, status)
        assert not calls[1].cancelled and next(calls[1]._items, None) is not None, error


def test_an_error_reply_first_is_its_status_and_body_and_no_retry() -> None:
    """What a tier answers as an error value (bad input, a request its engine
    ended) is the response as the tier wrote it; nothing was left running."""
    failures: list[str] = []
    refused = error_reply("bad n", param="n")
    calls = [Call([ServedBy(placement="inline", replica="r1"), refused]), Call([])]  # type: ignore[list-item]
    status, body = asyncio.run(body_of(calls, failures))
    assert (status, json.loads(body)) == (400, refused.body)
    assert failures == [] and next(calls[1]._items, None) is None
