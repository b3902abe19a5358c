"""The control plane's bookkeeping: subscriptions, commands, answers, dropped replicas.

Replicas are plain coroutines here that read ``subscribe`` and answer with
``reply``, as ``control_channel.ControlChannel`` does over Serve handles; the
real channel runs in the integration tests (abort and /metrics of a full replica).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from deployments import control_plane
from deployments.messages.control import ControlCommand
from tests.support.imports import heavy_modules_after

ControlPlane: Any = control_plane.ControlPlane

Answer = Callable[[ControlCommand], Any]


async def replica(
    fanout: Any,
    tier: str,
    name: str,
    answer: Answer | None,
    seen: list[str] | None = None,
    actor: Any = None,
) -> list[str]:
    """Reads its subscription until it ends; answers each command unless ``answer`` is None."""
    seen = [] if seen is None else seen
    async for command in fanout.subscribe(tier, name, actor):
        seen.append(command.kind)
        if command.kind != "subscribed" and answer is not None:
            await fanout.reply(command.id, answer(command))
    return seen


async def subscribed(fanout: Any, tier: str, name: str, *args: Any, **kwargs: Any) -> asyncio.Task:
    """``replica(...)`` started, once the fan-out has it."""
    task = asyncio.create_task(replica(fanout, tier, name, *args, **kwargs))
    for _ in range(100):
        if (tier, name) in fanout._subscribers:
            return task
        await asyncio.sleep(0)
    raise AssertionError(f"{name} never subscribed")


def held(ids: set[str]) -> Answer:
    return lambda command: sum(1 for i in command.request_ids if i in ids)


def test_abort_reaches_every_replica_of_both_tiers_and_sums_what_they_held() -> None:
    async def scenario() -> tuple[dict[str, int], dict[str, int], list[list[str]]]:
        fanout = ControlPlane()
        seen: list[list[str]] = [[], [], []]
        tasks = [
            await subscribed(fanout, "generate", "g1", held({"a"}), seen[0]),
            await subscribed(fanout, "generate", "g2", held({"b", "c"}), seen[1]),
            await subscribed(fanout, "derender", "d1", held({"b"}), seen[2]),
        ]
        counts = await fanout.subscribed()
        result = await fanout.abort(["a", "b", "c", "unknown"])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert not fanout._subscribers, "cancelled subscriptions must unregister"
        return counts, result, seen

    counts, result, seen = asyncio.run(scenario())
    assert counts == {"generate": 2, "derender": 1}
    assert result == {"generate": 3, "derender": 1}
    assert seen == [["subscribed", "abort"]] * 3


def test_no_subscribers_is_a_no_op() -> None:
    async def scenario() -> tuple[dict[str, int], list[Any], dict[str, int]]:
        fanout = ControlPlane()
        return await fanout.abort(["x"]), await fanout.engine_states(), await fanout.subscribed()

    assert asyncio.run(scenario()) == (
        {"generate": 0, "derender": 0},
        [],
        {"generate": 0, "derender": 0},
    )


def test_engine_states_asks_generate_only_and_keeps_states() -> None:
    from deployments.messages.control import EngineState

    def state(command: ControlCommand) -> Any:
        assert command.kind == "engine_state"
        return EngineState(replica="g1", unfinished_requests=2, vllm_metrics=[])

    async def scenario() -> list[Any]:
        fanout = ControlPlane()
        await subscribed(fanout, "generate", "g1", state)
        await subscribed(fanout, "generate", "g2", lambda command: None)  # its handler failed
        await subscribed(fanout, "derender", "d1", lambda command: pytest.fail("asked derender"))
        return await fanout.engine_states()

    states = asyncio.run(scenario())
    assert [(s.replica, s.unfinished_requests) for s in states] == [("g1", 2)]


def test_a_replica_that_does_not_answer_is_dropped_and_its_stream_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(control_plane, "GONE_CHECK_AFTER_S", 0.01)
    monkeypatch.setattr(control_plane, "REPLY_TIMEOUT_S", 0.05)

    async def scenario() -> tuple[dict[str, int], list[str], dict[str, int]]:
        fanout = ControlPlane()
        await subscribed(fanout, "generate", "live", held({"a"}))
        silent = await subscribed(fanout, "generate", "silent", None)
        result = await fanout.abort(["a"])
        seen = await asyncio.wait_for(silent, 1)
        return result, seen, await fanout.subscribed()

    result, seen, counts = asyncio.run(scenario())
    assert result == {"generate": 1, "derender": 0}
    assert seen == ["subscribed", "abort"]  # then its stream ended: it would subscribe afresh
    assert counts == {"generate": 1, "derender": 0}


def test_subscribing_again_under_the_same_name_ends_the_old_stream() -> None:
    async def scenario() -> tuple[list[str], dict[str, int], dict[str, int]]:
        fanout = ControlPlane()
        old = await subscribed(fanout, "derender", "d1", held({"a"}))
        await asyncio.sleep(0)
        new = asyncio.create_task(replica(fanout, "derender", "d1", held({"a"})))
        old_seen = await asyncio.wait_for(old, 1)
        result = await fanout.abort(["a"])
        counts = await fanout.subscribed()
        new.cancel()
        return old_seen, result, counts

    old_seen, result, counts = asyncio.run(scenario())
    assert old_seen == ["subscribed"]
    assert result == {"generate": 0, "derender": 1}  # answered once, by the new stream
    assert counts == {"generate": 0, "derender": 1}


class Actor:
    """A replica's actor handle as far as the fan-out uses it: Ray's own ping."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive
        self.__ray_ready__ = SimpleNamespace(remote=self._ping)

    async def _ping(self) -> bool:
        if not self.alive:
            raise ActorDiedError()
        return True


def test_a_dead_replica_is_dropped_without_waiting_out_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray does not end a dead replica's subscription; its actor's ping fails instead."""
    monkeypatch.setattr(control_plane, "GONE_CHECK_AFTER_S", 0.01)
    monkeypatch.setattr(control_plane, "REPLY_TIMEOUT_S", 60.0)

    async def scenario() -> tuple[dict[str, int], dict[str, int]]:
        fanout = ControlPlane()
        await subscribed(fanout, "generate", "live", held({"a"}), actor=Actor(alive=True))
        await subscribed(fanout, "generate", "killed", None, actor=Actor(alive=False))
        # Well inside the 60 s a dead replica would otherwise cost.
        result = await asyncio.wait_for(fanout.abort(["a"]), 10)
        return result, await fanout.subscribed()

    result, counts = asyncio.run(scenario())
    assert result == {"generate": 1, "derender": 0}
    assert counts == {"generate": 1, "derender": 0}


def test_a_slow_but_live_replica_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control_plane, "GONE_CHECK_AFTER_S", 0.01)

    async def slow(fanout: Any) -> None:
        async for command in fanout.subscribe("generate", "slow", Actor(alive=True)):
            if command.kind == "abort":
                await asyncio.sleep(0.2)  # twenty times the liveness check's wait
                await fanout.reply(command.id, 1)

    async def scenario() -> tuple[dict[str, int], dict[str, int]]:
        fanout = ControlPlane()
        task = asyncio.create_task(slow(fanout))
        while not fanout._subscribers:
            await asyncio.sleep(0)
        result = await fanout.abort(["a"])
        counts = await fanout.subscribed()
        task.cancel()
        return result, counts

    assert asyncio.run(scenario()) == (
        {"generate": 1, "derender": 0},
        {"generate": 1, "derender": 0},
    )


def test_health_counts_only_live_replicas() -> None:
    """A killed replica's subscription lingers in Ray; /health must not count it."""

    async def scenario() -> tuple[dict[str, int], list[str]]:
        fanout = ControlPlane()
        await subscribed(fanout, "generate", "live", held(set()), actor=Actor(alive=True))
        seen: list[str] = []
        killed = await subscribed(
            fanout, "derender", "killed", None, seen=seen, actor=Actor(alive=False)
        )
        counts = await fanout.subscribed()
        await asyncio.wait_for(killed, 1)  # dropped: its stream ended
        return counts, seen

    counts, seen = asyncio.run(scenario())
    assert counts == {"generate": 1, "derender": 0}
    assert seen == ["subscribed"]


def test_the_control_plane_replica_does_not_import_vllm() -> None:
    """ControlPlane's replica imports its module only: no vLLM, no torch (~9 s, ~700 MB)."""
    assert heavy_modules_after("import deployments.control_plane") == []
