"""The tiers' side of the edge: what a tier method called by the Ingress returns
or yields, as values the Ingress can read without importing vLLM.

- vLLM's models become ``Reply`` values (an ``ErrorResponse`` with its
  ``code`` as the status), their JSON body written here, once;
- a ``Refusal`` (a body that failed validation here) becomes its reply;
- an exception raised before the first answer becomes vLLM's answer to it
  when it is the request's fault or a request the engine ended
  (``GenerationError``), as vLLM's server answers them. Any other is raised
  as a ``TierFailure`` (or as Ray's own error), a type the Ingress can
  unpickle without vLLM, and answered 503 there.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any, ParamSpec, cast

from pydantic import BaseModel
from ray.exceptions import RayError
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import GenerationError

from deployments.edge.errors import Refusal
from deployments.messages.replies import Reply, ServedBy, TierFailure
from deployments.observability.metrics import graph_metrics
from deployments.observability.tracing import SERVE_REQUEST_ID, Carrier, serving, traced
from deployments.transport.replica_loss import EngineLostError
from deployments.transport.serve_internals import serve_request_id

P = ParamSpec("P")


def reply_of(value: Any) -> Any:
    """A vLLM model as a ``Reply``; any other value (SSE text, ``ServedBy``,
    ``RenderedText``) as it is."""
    if isinstance(value, ErrorResponse):
        return Reply(value.error.code, value.model_dump())
    if isinstance(value, BaseModel):
        return Reply(HTTPStatus.OK.value, value.model_dump())
    return value


def refusal_of(exc: Exception) -> Reply | None:
    """What vLLM's server answers for ``exc``, if that is a request's answer (bad
    input, a request its engine ended); None when a tier failed."""
    if isinstance(exc, Refusal):
        return exc.reply
    if isinstance(exc, RayError):
        return None
    mapped = create_error_response(exc)
    if mapped.error.code < HTTPStatus.INTERNAL_SERVER_ERROR or isinstance(exc, GenerationError):
        return reply_of(mapped)
    return None


def crossing(exc: Exception) -> Exception:
    """``exc`` as the Ingress may receive it: Ray's errors and a dead engine's as they
    are (the Ingress reads them: a lost replica is retried, a stream moved), any
    other as a ``TierFailure``."""
    if isinstance(exc, (RayError, EngineLostError)):
        return exc
    return TierFailure(f"{type(exc).__name__}: {exc}")


def answers_ingress(
    method: Callable[P, Awaitable[Any]],
) -> Callable[P, Awaitable[Any]]:
    """A unary tier method the Ingress calls: its answer as a ``Reply``; the time it
    took in ``scaleout_unary_call_seconds`` (on Render: the render time).

    A call with a ``trace`` keyword (the Ingress's span, ``observability/tracing.py``)
    runs in a span named after the tier (``render``), taken from ``kwargs`` before
    the method sees them; inside, ``request_carrier()`` is that context."""
    tags = {"method": method.__name__}
    tier = method.__qualname__.split(".")[0].lower()

    @functools.wraps(method)
    async def answer(*args: P.args, **kwargs: P.kwargs) -> Any:
        started = time.perf_counter()
        trace = cast("Carrier | None", kwargs.pop("trace", None))
        try:
            if trace is None:
                return reply_of(await method(*args, **kwargs))
            attributes = {"scaleout.method": method.__name__, SERVE_REQUEST_ID: serve_request_id()}
            with traced(tier, trace, attributes=attributes) as span:
                with serving(trace):
                    answered = await method(*args, **kwargs)
                if span is not None and isinstance(answered, ErrorResponse):
                    span.set_attribute("scaleout.status", answered.error.code)
            return reply_of(answered)
        except Exception as exc:
            reply = refusal_of(exc)
            if reply is None:
                raise crossing(exc) from None
            return reply
        finally:
            graph_metrics().unary_call_seconds.observe(time.perf_counter() - started, tags)

    return answer


async def ingress_items(items: AsyncGenerator[Any, None]) -> AsyncIterator[Any]:
    """A streamed tier call's items for the Ingress; what ``items`` raises before
    its first answer (a ``ServedBy`` marker is none) as ``answers_ingress`` does.

    ``items`` is closed with this generator (a client gone, a call cancelled), not
    left to the collector: its ``finally`` frees the engine's request."""
    answered = False
    try:
        async with contextlib.aclosing(items) as source:
            async for item in source:
                answered = answered or not isinstance(item, ServedBy)
                yield reply_of(item)
    except Exception as exc:
        reply = None if answered else refusal_of(exc)
        if reply is None:
            raise crossing(exc) from None
        yield reply
