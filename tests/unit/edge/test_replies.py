"""The tiers' answers to the Ingress (``edge/replies.py``): vLLM's models and errors
as plain replies, a tier's failure as a type the Ingress unpickles without vLLM."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi.responses import StreamingResponse
from ray.exceptions import ActorDiedError
from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelCard, ModelList
from vllm.exceptions import GenerationError, RetryableRequestError, VLLMValidationError

from deployments.edge.errors import Refusal, bad_request
from deployments.edge.replies import answers_ingress, ingress_items
from deployments.edge.tier_calls import respond
from deployments.messages.replies import Reply, ServedBy, TierFailure
from deployments.text.sse import DONE, sse_data
from deployments.transport.replica_loss import EngineLostError


async def tier_stream(items: list[Any], error: Exception | None = None) -> AsyncIterator[Any]:
    for item in items:
        yield item
    if error is not None:
        raise error


class TierCall:
    """A streamed handle call whose items are what the tier method yields for the
    Ingress, each through a pickle round trip as Ray sends them."""

    def __init__(self, items: list[Any], error: Exception | None = None) -> None:
        self._items = ingress_items(tier_stream(items, error))
        self.cancelled = False

    def __aiter__(self) -> TierCall:
        return self

    async def __anext__(self) -> Any:
        try:
            return pickle.loads(pickle.dumps(await anext(self._items)))
        except StopAsyncIteration:
            raise
        except Exception as exc:
            raise pickle.loads(pickle.dumps(exc)) from None

    def cancel(self) -> None:
        self.cancelled = True


class Tier:
    deployment_name = "Generate"


async def answer(call: TierCall, failures: list[str]) -> tuple[int, str]:
    response = await respond(
        lambda _: call, Tier(), on_failure=lambda _: failures.append("cleanup")
    )
    if not isinstance(response, StreamingResponse):
        return response.status_code, bytes(response.body).decode()
    chunks = [c if isinstance(c, str) else bytes(c).decode() async for c in response.body_iterator]
    return response.status_code, "".join(chunks)


@pytest.mark.parametrize(
    ("cause", "status", "err_type"),
    [
        (GenerationError(), 500, "InternalServerError"),
        (RetryableRequestError(), 503, "ServiceUnavailableError"),
        (VLLMValidationError("logprobs too many", parameter="logprobs"), 400, "BadRequestError"),
        (ValueError("bad prompt"), 400, "BadRequestError"),
    ],
)
def test_what_a_tier_raises_before_its_first_answer_is_vllms_own_answer(
    cause: Exception, status: int, err_type: str
) -> None:
    """As vLLM's server answers it, even after the ``ServedBy`` marker; nothing is
    left running, so nothing is cleaned up."""
    for before in ([], [ServedBy(placement="tier", replica="r1")]):
        failures: list[str] = []
        code, body = asyncio.run(answer(TierCall(before, cause), failures))
        error = json.loads(body)["error"]
        assert (code, error["code"], error["type"], error["message"]) == (
            status,
            status,
            err_type,
            str(cause),
        )
        assert failures == []


def test_a_refusal_is_its_reply() -> None:
    code, body = asyncio.run(answer(TierCall([], Refusal(bad_request("no", param="n"))), []))
    assert (code, json.loads(body)["error"]["param"]) == (400, "n")


def test_a_tiers_own_failure_crosses_without_vllm_and_is_a_503_with_cleanup() -> None:
    """An error vLLM answers 500 that is not a request its engine ended (a tier
    broke) crosses as a ``TierFailure``; the Ingress answers 503 and cleans up."""
    failures: list[str] = []
    code, body = asyncio.run(answer(TierCall([], RuntimeError("engine gone")), failures))
    assert (code, json.loads(body)["error"]["code"]) == (503, 503)
    assert failures == ["cleanup"]

    async def raised() -> BaseException:
        try:
            await anext(ingress_items(tier_stream([], RuntimeError("boom"))))
        except Exception as exc:
            return exc
        raise AssertionError("nothing raised")

    crossed = asyncio.run(raised())
    assert type(crossed) is TierFailure and str(crossed) == "RuntimeError: boom"


def test_a_dead_engine_crosses_as_itself_so_the_ingress_can_move_the_call() -> None:
    """``EngineLostError`` names the replica whose engine died: the Ingress reads it
    (``transport/replica_loss.py``) to call again elsewhere, or move the stream."""

    async def raised(items: list[str]) -> BaseException:
        try:
            async for _ in ingress_items(tier_stream(items, EngineLostError("r1"))):
                pass
        except Exception as exc:
            return exc
        raise AssertionError("nothing raised")

    for items in ([], [sse_data({"i": 0})]):  # before its first answer, and mid-stream
        crossed = asyncio.run(raised(items))
        assert type(crossed) is EngineLostError and crossed.replica == "r1"


def test_mid_stream_errors_cross_as_tier_failures_and_end_the_stream() -> None:
    failures: list[str] = []
    code, body = asyncio.run(answer(TierCall([sse_data({"i": 0})], GenerationError()), failures))
    events = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert code == 200 and json.loads(events[0]) == {"i": 0}
    assert json.loads(events[1])["error"]["message"] == "stream failed: TierFailure"
    assert events[2] == DONE
    assert failures == ["cleanup"]


def test_rays_errors_cross_as_they_are_so_a_lost_replica_is_retried() -> None:
    async def crossed() -> BaseException:
        try:
            await anext(ingress_items(tier_stream([], ActorDiedError())))
        except Exception as exc:
            return exc
        raise AssertionError("nothing raised")

    assert isinstance(asyncio.run(crossed()), ActorDiedError)


def test_unary_answers_are_replies_of_vllms_models() -> None:
    class Method:
        @answers_ingress
        async def models(self) -> ModelList:
            return ModelList(data=[ModelCard(id="m")])

        @answers_ingress
        async def refused(self) -> ErrorResponse:
            raise VLLMValidationError("bad", parameter="n")

        @answers_ingress
        async def broke(self) -> None:
            raise RuntimeError("boom")

    method = Method()
    models = asyncio.run(method.models())
    assert isinstance(models, Reply) and models.status == 200
    assert models.body["data"][0]["id"] == "m"
    refused = asyncio.run(method.refused())
    assert (refused.status, refused.body["error"]["param"]) == (400, "n")
    with pytest.raises(TierFailure, match="RuntimeError: boom"):
        asyncio.run(method.broke())
