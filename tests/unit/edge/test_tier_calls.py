"""Handle results to HTTP: when a tier's failure triggers cleanup, and when not."""

from __future__ import annotations

import asyncio
import itertools
import json

from fastapi.responses import StreamingResponse
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError
from ray.serve.exceptions import BackPressureError
from vllm.exceptions import GenerationError, RetryableRequestError, VLLMValidationError

from deployments.edge.tier_calls import RETRIES_ON_REPLICA_LOSS, respond
from deployments.text.sse import DONE, sse_data


class Call:
    """A streamed handle call: yields ``items``, then raises ``error`` if set."""

    def __init__(self, items: list[str], error: Exception | None = None) -> None:
        self._items = iter(items)
        self._error = error
        self.cancelled = False

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> str:
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


async def body_of(call: Call | list[Call], failures: list[str]) -> tuple[int, str]:
    """The response to ``call``, or to each call of the list in turn as calls are made."""
    calls = iter(call if isinstance(call, list) else [call])
    response = await respond(
        lambda: next(calls), Tier(), on_failure=lambda _: failures.append("cleanup")
    )
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


def test_a_replica_lost_before_the_first_item_every_time_is_a_503_with_cleanup() -> None:
    failures: list[str] = []
    calls = [Call([], ActorDiedError()) for _ in range(RETRIES_ON_REPLICA_LOSS + 2)]
    status, _ = asyncio.run(body_of(calls, failures))
    assert status == 503
    assert failures == ["cleanup"] * (RETRIES_ON_REPLICA_LOSS + 1)
    assert [c.cancelled for c in calls] == [True] * (RETRIES_ON_REPLICA_LOSS + 1) + [False]


def test_a_failure_that_is_not_a_lost_replica_is_not_called_again() -> None:
    """Overload, bad input and a request its engine ended each answer at once."""
    for error in (
        BackPressureError(num_queued_requests=2, max_queued_requests=1),
        VLLMValidationError("bad", parameter="n"),
        GenerationError(),
    ):
        calls = [Call([], error), Call([sse_data({"i": 1})])]
        status, _ = asyncio.run(body_of(calls, []))
        assert status in (400, 500, 503), (error, status)
        assert not calls[1].cancelled and next(calls[1]._items, None) is not None, error


def test_a_request_its_engine_ended_is_vllms_own_answer_without_cleanup() -> None:
    """vLLM's server answers a request whose engine ended it with an error
    (``finish_reason: "error"``) 500, or 503 when it is retryable; nothing is left
    running, so nothing is aborted."""
    cases = ((GenerationError(), 500), (RetryableRequestError(), 503))
    for (cause, status), wrapped in itertools.product(cases, (True, False)):
        failures: list[str] = []
        # Over the object store Ray wraps what the tier raised; over gRPC it does not.
        failed = RayTaskError("generate", "traceback", cause) if wrapped else cause
        code, body = asyncio.run(body_of(Call([], failed), failures))
        error = json.loads(body)["error"]
        assert (code, error["code"], error["message"]) == (status, status, str(cause))
        assert error["type"] == (
            "InternalServerError" if status == 500 else "ServiceUnavailableError"
        )
        assert failures == []


def test_bad_input_a_tier_raised_is_a_400_however_it_travelled() -> None:
    """vLLM's validation errors raised in a tier are vLLM's 400, wrapped in a
    ``RayTaskError`` (object store) or not (Serve's gRPC data plane)."""
    cause = VLLMValidationError("logprobs too many", parameter="logprobs")
    for failed in (RayTaskError("generate", "traceback", cause), cause):
        failures: list[str] = []
        code, body = asyncio.run(body_of(Call([], failed), failures))
        assert (code, json.loads(body)["error"]["type"]) == (400, "BadRequestError")
        assert failures == []
