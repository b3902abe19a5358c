"""A Generate replica's calls in flight: which ones a dead caller, a replica Serve
stops and a dead engine end, with fakes for vLLM's engine and ``ServingTokens``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from deployments.messages.tier import moved_key, prompt_key
from deployments.transport.replica_loss import EngineLostError, ReplicaLeavingError
from deployments.vllm_adapter.engine_calls import EngineCalls
from deployments.vllm_adapter.engine_streams import EngineCall


class Engine:
    errored = False


class ServingTokens:
    """Answers every request with a stream of ``events``, or waits in ``serve_tokens``
    until cancelled when ``hold`` is set."""

    def __init__(self, events: list[str], hold: bool = False) -> None:
        self.events = events
        self.hold = hold

    async def serve_tokens(self, request: Any) -> AsyncGenerator[str, None]:
        if self.hold:
            await asyncio.Event().wait()

        async def stream() -> AsyncGenerator[str, None]:
            for event in self.events:
                yield event

        return stream()


async def _call_held_open(
    calls: EngineCalls, key: str | None, movable: bool, opened: asyncio.Queue[EngineCall]
) -> str:
    """A call that waits on the engine (inside ``opening``) until ended from outside."""
    call = calls.open(key, movable=movable)
    await opened.put(call)
    try:
        with call.opening():
            await calls.serve_tokens(object(), call)  # type: ignore[arg-type]
    except asyncio.CancelledError:
        return "cancelled"
    except ReplicaLeavingError:
        return "moved"
    finally:
        await calls.close(call, key)
    return "answered"


def test_a_dead_callers_keys_end_its_calls_and_only_those() -> None:
    async def run() -> tuple[int, list[str], bool]:
        calls = EngineCalls(Engine(), ServingTokens([], hold=True), "r")
        opened: asyncio.Queue[EngineCall] = asyncio.Queue()
        keys = [prompt_key("dead", 0), moved_key("dead", 1), "alive"]
        tasks = [asyncio.create_task(_call_held_open(calls, k, True, opened)) for k in keys]
        for _ in keys:
            await opened.get()
        await asyncio.sleep(0)
        ended = calls.abort_calls(["dead"])
        done, pending = await asyncio.wait(tasks, timeout=1)
        outcomes = [t.result() for t in tasks if t in done]
        busy = calls.busy  # the live one still runs
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return ended, outcomes, busy

    ended, outcomes, busy = asyncio.run(run())
    assert ended == 2
    assert outcomes == ["cancelled", "cancelled"]
    assert busy


def test_leaving_moves_the_movable_calls_waiting_on_the_engine_and_no_other() -> None:
    async def run() -> tuple[list[str], bool]:
        calls = EngineCalls(Engine(), ServingTokens([], hold=True), "r")
        opened: asyncio.Queue[EngineCall] = asyncio.Queue()
        movable = asyncio.create_task(_call_held_open(calls, None, True, opened))
        fixed = asyncio.create_task(_call_held_open(calls, None, False, opened))
        await opened.get()
        await opened.get()
        await asyncio.sleep(0)
        calls.leave()
        done, _ = await asyncio.wait([movable, fixed], timeout=1)
        outcomes = [t.result() for t in (movable, fixed) if t in done]
        still_busy = calls.busy
        fixed.cancel()
        await asyncio.gather(fixed, return_exceptions=True)
        return outcomes, still_busy

    outcomes, still_busy = asyncio.run(run())
    # The movable one tells its caller to make it again elsewhere; the other goes on.
    assert outcomes == ["moved"]
    assert still_busy
    calls = EngineCalls(Engine(), ServingTokens([]), "r")
    calls.leave()
    with pytest.raises(ReplicaLeavingError):
        calls.refuse_if_leaving()


def test_a_stream_on_a_replica_that_starts_leaving_moves_at_its_next_event() -> None:
    async def run() -> list[str]:
        calls = EngineCalls(Engine(), ServingTokens(["data: 1\n\n", "data: 2\n\n"]), "r")
        call = calls.open(None, movable=True)
        stream = await calls.serve_tokens(object(), call)  # type: ignore[arg-type]
        assert isinstance(stream, AsyncGenerator)
        got = [await anext(stream)]
        calls.leave()
        try:
            got.append(await anext(stream))
        except ReplicaLeavingError:
            got.append("moved")
        await calls.close(call, None)
        return got

    assert asyncio.run(run()) == ["data: 1\n\n", "moved"]


def test_a_stream_its_dead_engine_ends_with_an_error_event_raises_engine_lost() -> None:
    engine = Engine()

    async def run() -> None:
        events = ['data: {"error": {"message": "engine dead"}}\n\n']
        calls = EngineCalls(engine, ServingTokens(events), "r")
        call = calls.open(None)
        stream = await calls.serve_tokens(object(), call)  # type: ignore[arg-type]
        engine.errored = True
        try:
            assert isinstance(stream, AsyncGenerator)
            await anext(stream)
        finally:
            await calls.close(call, None)

    with pytest.raises(EngineLostError):
        asyncio.run(run())
