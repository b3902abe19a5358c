"""Calls from the Ingress into the tiers, and what their answers are in HTTP.

Where the tiers' replies (``messages/replies.py``: answers and error values,
already JSON) and failures of a handle call become answers: 4xx for bad
input, 503 with ``Retry-After`` when a tier sheds load or has no replica,
and, once a stream has started, an SSE error event and ``[DONE]`` instead of
a silent cut. ``call`` raises what a client must be
told as a ``Refusal`` (``errors``), which the Ingress's handler answers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import grpc
from fastapi.responses import Response, StreamingResponse
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from deployments.edge.errors import (
    Refusal,
    anthropic_error,
    bad_request,
    no_live_replica,
    to_http,
    unavailable,
)
from deployments.messages.replies import Reply, ServedBy, error_reply
from deployments.observability.metrics import Gaps, graph_metrics
from deployments.observability.tracing import end_span, request_carrier, start_span
from deployments.text.sse import DONE, responses_error_event, sse_data
from deployments.transport.replica_assignment import wait_routed
from deployments.transport.replica_loss import callee_lost, lost_engine_replica, raised_in_tier

logger = logging.getLogger("ray.serve")

SERVED_BY_HEADER = "X-Served-By"
REPLICA_PID_HEADER = "X-Served-By-Pid"
RETRY_AFTER_S = "1"
# Calls made again when their replica is lost before their first item (``respond``).
RETRIES_ON_REPLICA_LOSS = 2


async def respond(
    start: Callable[[tuple[str, ...]], Any],
    via: DeploymentHandle[Any],
    headers: dict[str, str] | None = None,
    on_failure: Callable[[Any], None] | None = None,
    stream_error: Callable[[Reply], list[str]] | None = None,
) -> Response:
    """One streamed handle call, made through ``via`` by ``start(avoid)``, → HTTP.

    A call that no replica of ``via`` can take (none is running) is a 503 at
    once rather than a wait in Serve's router (``routable.wait_routed``).
    The first item is awaited before any status is sent, so an error that
    comes first (bad input, overload) is a real 4xx/5xx, not a 200 with a
    cut-off body. A unary call yields exactly one item.

    A call whose replica (or engine) is lost before its first item (``callee_lost``) has
    sent the client nothing, so it is made again, ``RETRIES_ON_REPLICA_LOSS``
    times at most: a node that dies takes a while to be noticed, and requests
    that Serve sent to its replicas meanwhile would otherwise all fail. ``avoid``
    names the Generate replicas whose engine died under an earlier try (their
    actors linger a moment, listed by Serve's router); ``start`` tells the router.

    ``on_failure(call)`` runs when a tier fails under a call (not for overload
    or bad input): a replica that died mid-stream cannot cancel the calls it
    made, so the caller cleans up what they may have left running.

    ``stream_error(error)``: the events that end a stream cut after its start;
    by default vLLM's OpenAI error event and ``[DONE]`` (``openai_stream_error``).
    """
    retries = RETRIES_ON_REPLICA_LOSS
    avoid: tuple[str, ...] = ()
    started = time.perf_counter()
    while True:
        items = start(avoid)
        if not await _routed(items, via):
            return to_http(no_live_replica(via.deployment_name))
        try:
            first, served_by = await _first_item(items)
            break
        except BaseException as exc:
            _cancel(items)
            if not isinstance(exc, Exception):
                raise
            error = failure_error(exc)
            if on_failure is not None and _tier_failed(exc, error):
                on_failure(items)
            if retries > 0 and callee_lost(exc):
                retries -= 1
                dead = lost_engine_replica(exc)
                avoid = avoid if dead is None else (*avoid, dead)
                logger.warning("%s replica lost before the first item (%r): calling again",
                               via.deployment_name, exc)  # fmt: skip
                continue
            return to_http(error, {"Retry-After": RETRY_AFTER_S})
    if served_by is not None:
        headers = {**(headers or {}), SERVED_BY_HEADER: served_by.replica}
        if served_by.pid is not None:
            headers[REPLICA_PID_HEADER] = str(served_by.pid)
    metrics = graph_metrics()
    if isinstance(first, Reply):
        if not first.is_error:
            metrics.first_item_seconds.observe(
                time.perf_counter() - started, {"callee": via.deployment_name, "kind": "answer"}
            )
        return to_http(first, headers)
    metrics.first_item_seconds.observe(
        time.perf_counter() - started, {"callee": via.deployment_name, "kind": "stream"}
    )
    # The stream as the client is sent it, from its first item (tracing.py).
    span = start_span(
        "response", request_carrier(), attributes={"scaleout.callee": via.deployment_name}
    )

    async def events() -> AsyncIterator[str]:
        gaps = Gaps()
        error: BaseException | None = None
        try:
            gaps.tick()
            yield first
            async for event in items:
                gaps.tick()
                yield event
        except Exception as exc:
            # The status line is gone; say so in the stream, as vLLM does.
            logger.warning("stream failed after it started: %r", exc)
            metrics.stream_errors.inc()
            if on_failure is not None:
                on_failure(items)
            error = exc
            failed = unavailable(f"stream failed: {type(exc).__name__}")
            for event in (stream_error or openai_stream_error)(failed):
                yield event
        finally:
            # A client that went away cancels the whole call chain.
            _cancel(items)
            end_span(span, error)

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def openai_stream_error(error: Reply) -> list[str]:
    """How vLLM's OpenAI routes end a stream that failed: the error, then ``[DONE]``."""
    return [sse_data(error.body), sse_data(DONE)]


def responses_stream_error(error: Reply) -> list[str]:
    """How a Responses stream ends when a tier fails under it: Responses' ``error``
    event (no ``sequence_number``: the Ingress does not count the tier's events)."""
    return [responses_error_event(error.body.get("error", {}))]


def anthropic_stream_error(error: Reply) -> list[str]:
    """How vLLM's Messages route ends one: Anthropic's ``error`` event."""
    data = json.dumps(anthropic_error(error.body), separators=(",", ":"))
    return [f"event: error\ndata: {data}\n\n"]


async def _first_item(items: Any) -> tuple[Any, ServedBy | None]:
    """A call's first item, and the ``ServedBy`` marker that came before it, if any."""
    first = await anext(items)
    if not isinstance(first, ServedBy):
        return first, None
    return await anext(items), first


async def call(response: Any, via: DeploymentHandle[Any]) -> Any:
    """The answer of a unary call made through ``via`` (a ``Reply``'s body, or a value
    that is not a reply); an error value it returned, or its failure, is raised as
    a ``Refusal``."""
    if not await _routed(response, via):
        raise Refusal(no_live_replica(via.deployment_name))
    try:
        answer = await response
    except Exception as exc:
        raise Refusal(failure_error(exc)) from None
    if isinstance(answer, Reply):
        if answer.is_error:
            raise Refusal(answer)
        return answer.body
    return answer


async def _routed(items: Any, via: DeploymentHandle[Any]) -> bool:
    """``wait_routed``, with the call cancelled unless a replica took it: none can
    (False), or the wait itself was cancelled (the client went away, its handler
    with it), which would otherwise leave the call to run on for nobody."""
    try:
        if await wait_routed(items, via):
            return True
    except BaseException:
        _cancel(items)
        raise
    _cancel(items)
    return False


def failure_error(exc: Exception) -> Reply:
    """What a failed handle call means to a client. (A tier answers what vLLM would
    answer for its own errors, bad input or a request its engine ended, as values:
    ``edge/replies.py``; what is raised here is a failure.)"""
    cause = raised_in_tier(exc)
    if isinstance(cause, (pickle.PicklingError, RecursionError)):
        # The request (or its answer) cannot be pickled between tiers: no retry helps.
        return bad_request(f"the request cannot be passed between tiers: {type(cause).__name__}")
    if isinstance(exc, BackPressureError):
        return unavailable("the server is overloaded; retry later")
    if _too_large_to_cross(cause):
        # No retry can succeed: the request or its answer is too large for the hop.
        return error_reply(
            "a message between the graph's tiers exceeds Serve's gRPC limit "
            "(RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH)",
            "RequestEntityTooLarge",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    logger.warning("handle call failed: %r", exc)
    return unavailable(f"a serving tier failed: {type(exc).__name__}")


def _too_large_to_cross(exc: Exception) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and (
        exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    )


def _tier_failed(exc: Exception, error: Reply) -> bool:
    """A tier broke under the call; overload and bad input leave nothing running."""
    return (
        not isinstance(exc, BackPressureError) and error.status >= HTTPStatus.INTERNAL_SERVER_ERROR
    )


def _cancel(items: Any) -> None:
    """Cancel a handle call; one that already failed (e.g. backpressure) re-raises, so
    its error is dropped here: the caller already answers for it."""
    cancel = getattr(items, "cancel", None)
    if cancel is not None:
        with contextlib.suppress(Exception):
            cancel()
