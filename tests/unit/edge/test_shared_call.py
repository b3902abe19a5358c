"""SharedCall: concurrent callers share one call; its answer serves for ttl_s."""

from __future__ import annotations

import asyncio

import pytest

from deployments.edge.shared_call import SharedCall


def test_concurrent_callers_share_one_call_and_a_later_one_after_ttl_makes_another() -> None:
    calls = 0

    async def fan_out() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return calls

    async def run() -> tuple[list[int], int, int]:
        shared: SharedCall[int] = SharedCall(ttl_s=0.2)
        together = await asyncio.gather(*(shared.get(fan_out) for _ in range(50)))
        reused = await shared.get(fan_out)  # within ttl of the answer
        await asyncio.sleep(0.25)
        return together, reused, await shared.get(fan_out)

    together, reused, later = asyncio.run(run())
    assert together == [1] * 50 and reused == 1 and later == 2


def test_a_failure_is_not_reused() -> None:
    outcomes = iter([RuntimeError("down"), 7])

    async def flaky() -> int:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def run() -> int:
        shared: SharedCall[int] = SharedCall(ttl_s=60)
        with pytest.raises(RuntimeError):
            await shared.get(flaky)
        return await shared.get(flaky)

    assert asyncio.run(run()) == 7


def test_a_caller_that_leaves_does_not_cancel_the_others() -> None:
    async def slow() -> str:
        await asyncio.sleep(0.1)
        return "ok"

    async def run() -> str:
        shared: SharedCall[str] = SharedCall(ttl_s=1)
        leaving = asyncio.ensure_future(shared.get(slow))
        staying = asyncio.ensure_future(shared.get(slow))
        await asyncio.sleep(0.01)
        leaving.cancel()
        return await staying

    assert asyncio.run(run()) == "ok"
