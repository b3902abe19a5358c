"""EngineCall: a call closes the engine streams it opened, and only those."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from deployments.vllm_adapter.engine_streams import EngineCall, record_streams


class _Engine:
    """``generate`` as AsyncLLM's: a lazy stream that aborts its own request when closed."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    async def generate(self, request_id: str) -> AsyncGenerator[str, None]:
        internal = f"{request_id}-{len(self.aborted)}"
        try:
            while True:
                yield internal
                await asyncio.sleep(0)
        except GeneratorExit:
            self.aborted.append(internal)
            raise


def test_a_call_closes_only_the_streams_it_opened() -> None:
    async def run() -> tuple[list[str], str]:
        engine = _Engine()
        record_streams(engine)
        mine, theirs = EngineCall(), EngineCall()
        with mine.opening():
            my_stream = engine.generate("same-id")
        with theirs.opening():
            their_stream = engine.generate("same-id")
        outside = engine.generate("same-id")  # no call records it
        for stream in (my_stream, their_stream, outside):
            await anext(stream)
        await mine.close()
        still = await anext(their_stream)
        await theirs.close()
        await outside.aclose()
        return engine.aborted, still

    aborted, still = asyncio.run(run())
    # Two requests named alike: the first call's end leaves the second running.
    assert aborted[0] == "same-id-0" and still == "same-id-0"
    assert len(aborted) == 3


class _WaitingEngine:
    """``generate``'s stream waits for its first output, as an engine's does."""

    async def generate(self, request_id: str) -> AsyncGenerator[str, None]:
        await asyncio.Event().wait()
        yield request_id


def test_a_stream_read_by_another_task_is_left_to_that_task() -> None:
    """aclose() of a generator another task is reading raises RuntimeError; close()
    leaves it to that task, whose cancellation ends it."""

    async def run() -> bool:
        engine = _WaitingEngine()
        record_streams(engine)
        call = EngineCall()
        with call.opening():
            stream = engine.generate("x")
        reader = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # the reader is inside the stream now
        assert stream.ag_running
        await call.close()  # must not raise
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return stream.ag_running

    assert asyncio.run(run()) is False
