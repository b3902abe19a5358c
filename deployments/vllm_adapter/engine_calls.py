"""A Generate replica's calls in flight on its engine, and what ends them early.

Each call (a stream or a unary answer) is an ``EngineCall``: the engine requests
it opened (``engine_streams.py``). They are kept here so that the replica can end
them when something outside the call says so: its caller died (``abort_calls``,
by the key the caller named the call with), Serve is stopping the replica
(``leave``: what can move goes back to its caller), or the engine died (a call it
ends raises ``EngineLostError`` rather than answering vLLM's error for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable
from typing import Any

from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateRequest,
    GenerateResponseBase,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

from deployments.messages.tier import text_call_key
from deployments.observability.metrics import Gaps
from deployments.observability.tracing import Carrier
from deployments.transport.replica_loss import EngineLostError, ReplicaLeavingError
from deployments.vllm_adapter.engine_streams import EngineCall

logger = logging.getLogger("ray.serve")
_ERROR_EVENT = 'data: {"error"'


class EngineCalls:
    """The calls in flight on one engine, served by vLLM's ``ServingTokens``."""

    def __init__(
        self, engine: Any, serving_tokens: Any, replica: str, serving_completion: Any = None
    ) -> None:
        self._engine = engine
        self._serving_tokens = serving_tokens
        self._serving_completion = serving_completion
        self._replica = replica
        # The bound calls in flight, by their caller's key: a caller that died (a
        # Derender replica) cannot cancel them, so the Ingress ends them by key.
        self._keyed: dict[str, EngineCall] = {}
        self._running: set[EngineCall] = set()
        self._leaving = False  # Serve is stopping this replica (``leave``)

    @property
    def busy(self) -> bool:
        """Whether any call is in flight."""
        return bool(self._running)

    def open(
        self, key: str | None, movable: bool = True, trace: Carrier | None = None
    ) -> EngineCall:
        """A new call; ``key``: its caller's name for it, if the caller may end it."""
        call = EngineCall(movable, trace)
        self._running.add(call)
        if key is not None:
            self._keyed[key] = call
        return call

    async def close(self, call: EngineCall, key: str | None) -> None:
        """A call that ends, however (client gone, caller cancelled, finished), frees
        its engine requests and only those: Ray does not always deliver
        ``CancelledError`` into the call, and another request may share its id."""
        if key is not None and self._keyed.get(key) is call:
            del self._keyed[key]
        self._running.discard(call)
        await call.close()

    def abort_calls(self, keys: list[str]) -> int:
        """End the keyed calls with these keys (their caller died); how many were here."""
        ended = set(keys)
        # A multi-prompt completion's Generate calls carry its key and their prompt.
        calls = [call for key, call in self._keyed.items() if text_call_key(key) in ended]
        for call in calls:
            call.cancel()
        return len(calls)

    def leave(self) -> None:
        """Serve is stopping this replica (a scale-in, a redeploy): rather than wait
        for its streams until ``graceful_shutdown_timeout_s`` cuts them, every call
        that can move raises ``ReplicaLeavingError`` at its next engine event (a
        unary one at once), and so does every call that still arrives, so that its
        caller makes it again on another replica from where it was. What cannot
        move (multi-prompt completions, inline Responses streams) goes on for as
        long as Serve waits."""
        self._leaving = True
        movable = [call for call in self._running if call.movable]
        logger.warning(
            "replica %s is being stopped: moving its %d streams to other replicas",
            self._replica, len(movable),
        )  # fmt: skip
        for call in movable:
            if call.awaiting:  # a unary call, inside the engine's await
                call.cancel()

    def refuse_if_leaving(self) -> None:
        """Before a call's first item: its caller then calls another replica."""
        if self._leaving:
            raise ReplicaLeavingError(self._replica)

    async def serve_tokens(
        self, request: GenerateRequest, call: EngineCall
    ) -> ErrorResponse | GenerateResponseBase | AsyncGenerator[str, None]:
        """vLLM's ``serve_tokens``, but a call its engine's death ends raises
        ``EngineLostError`` (its callers may make it again on another replica,
        ``transport/migration.py``) instead of answering vLLM's error for it, and
        a movable call on a replica Serve is stopping raises ``ReplicaLeavingError``."""
        result = await self._served(self._serving_tokens.serve_tokens(request), call)
        if isinstance(result, (ErrorResponse, GenerateResponseBase)):
            return result
        return self._engine_events(result, call.movable)

    async def serve_completion(
        self, request: CompletionRequest, call: EngineCall
    ) -> CompletionResponse | ErrorResponse:
        """vLLM's own completion server's unary answer, for what only it serves beside
        the engine: beam search (``BeamSearchOnlineMixin``), which runs the engine a
        step at a time for each beam. Inside ``call.opening`` every engine request it
        makes is the call's, and ends with it. Failures as ``serve_tokens``'."""
        if self._serving_completion is None:
            return create_error_response("this engine serves no completions")
        result = await self._served(self._serving_completion.create_completion(request), call)
        if not isinstance(result, (CompletionResponse, ErrorResponse)):
            # A stream: the request asked for one, which beam search refuses first.
            raise TypeError(f"vLLM answered a unary completion with {type(result).__name__}")
        return result

    async def _served(self, answer: Awaitable[Any], call: EngineCall) -> Any:
        """vLLM's answer for ``call``, but ``EngineLostError`` where the engine's death
        ended it and ``ReplicaLeavingError`` where ``leave`` did."""
        self._raise_if_left(call)
        try:
            result = await answer
        except asyncio.CancelledError:
            self._raise_if_left(call)  # cancelled by leave
            raise
        except Exception as exc:
            self._raise_if_engine_lost(exc)
            raise
        if isinstance(result, ErrorResponse):
            self._raise_if_engine_lost()
            # Cancelled by leave: vLLM answers that "Client disconnected".
            self._raise_if_left(call)
        return result

    async def _engine_events(
        self, events: AsyncGenerator[str, None], movable: bool
    ) -> AsyncGenerator[str, None]:
        gaps = Gaps()
        async with contextlib.aclosing(events):
            async for event in events:
                gaps.tick()
                # vLLM ends a stream its engine failed with an error event.
                if event.startswith(_ERROR_EVENT):
                    self._raise_if_engine_lost()
                if self._leaving and movable:
                    raise ReplicaLeavingError(self._replica)
                yield event

    def _raise_if_left(self, call: EngineCall) -> None:
        """A movable call on a replica Serve is stopping goes back to its caller; one
        ``leave`` cancelled goes on to say so."""
        if self._leaving and call.movable:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                task.uncancel()
            raise ReplicaLeavingError(self._replica)

    def _raise_if_engine_lost(self, error: BaseException | None = None) -> None:
        if self._engine.errored:
            raise EngineLostError(self._replica) from error
