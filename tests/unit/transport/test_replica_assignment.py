"""When a call is answered 503 rather than left waiting in Serve's router.

The router's state comes through ``serve_internals.router_view``, replaced here
by a stand-in; that Ray's own router gives what the view reads is checked
against Ray in ``tests/integration/test_serve_internals.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest

from deployments.transport import replica_assignment
from deployments.transport.replica_assignment import no_replica_to_route_to, wait_routed
from deployments.transport.serve_internals import RouterView


class Router:
    """What ``router_view`` answers for the one handle of a test."""

    def __init__(self, view: RouterView | None) -> None:
        self.view = view


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Router:
    stand_in = Router(RouterView(running=1, scales_to_zero=False))
    monkeypatch.setattr(replica_assignment, "router_view", lambda _: stand_in.view)
    return stand_in


HANDLE: Any = object()


def call(assignment: concurrent.futures.Future[Any]) -> Any:
    """A handle call's response: its replica assignment is a future (Serve's own loop)."""
    return SimpleNamespace(_replica_result_future=assignment)


def test_no_replica_means_503_only_when_the_router_knows_and_none_is_coming(
    router: Router,
) -> None:
    router.view = RouterView(running=0, scales_to_zero=False)
    assert no_replica_to_route_to(HANDLE)
    router.view = RouterView(running=1, scales_to_zero=False)
    assert not no_replica_to_route_to(HANDLE)
    # Scaling from zero: queued calls are what make Serve start a replica.
    router.view = RouterView(running=0, scales_to_zero=True)
    assert not no_replica_to_route_to(HANDLE)
    # Not told yet whether it scales to zero, or never told of a replica (a
    # deployment still starting, or a Ray that moved its router state): the call
    # waits as Serve would have it wait.
    router.view = RouterView(running=0, scales_to_zero=None)
    assert not no_replica_to_route_to(HANDLE)
    router.view = None
    assert not no_replica_to_route_to(HANDLE)


def test_a_call_the_router_holds_gives_up_once_no_replica_is_left(router: Router) -> None:
    async def run() -> tuple[bool, bool]:
        pending: concurrent.futures.Future[Any] = concurrent.futures.Future()
        waiting = asyncio.ensure_future(wait_routed(call(pending), HANDLE))
        await asyncio.sleep(0.3)
        held = not waiting.done()
        router.view = RouterView(running=0, scales_to_zero=False)  # the last one died
        return held, await waiting

    held, routed = asyncio.run(run())
    assert held, "gave up while a replica was still there"
    assert not routed


def test_a_call_a_replica_takes_is_routed_at_once(router: Router) -> None:
    async def run() -> bool:
        pending: concurrent.futures.Future[Any] = concurrent.futures.Future()
        waiting = asyncio.ensure_future(wait_routed(call(pending), HANDLE))
        await asyncio.sleep(0)
        pending.set_exception(RuntimeError("assignment failed"))  # the caller reads it later
        return await asyncio.wait_for(waiting, 1)

    assert asyncio.run(run())
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.set_result(None)
    router.view = RouterView(running=0, scales_to_zero=False)
    assert asyncio.run(wait_routed(call(done), HANDLE))


def test_a_channel_stream_is_watched_through_its_own_handle_call(router: Router) -> None:
    """A step-channel stream wraps its handle call; the assignment watched is that call's."""
    pending: concurrent.futures.Future[Any] = concurrent.futures.Future()
    stream = SimpleNamespace(handle_response=call(pending))
    router.view = RouterView(running=0, scales_to_zero=False)
    assert not asyncio.run(wait_routed(stream, HANDLE))


def test_a_patient_call_waits_for_a_replica_to_start_and_then_gives_up(router: Router) -> None:
    """A stream that moves with ``generate.migration_wait_s``: no replica runs, but one
    may start (the one replica restarting, or redeployed)."""
    router.view = RouterView(running=0, scales_to_zero=False)

    async def run() -> tuple[bool, bool, bool]:
        impatient: concurrent.futures.Future[Any] = concurrent.futures.Future()
        at_once = await wait_routed(call(impatient), HANDLE)
        started: concurrent.futures.Future[Any] = concurrent.futures.Future()
        waiting = asyncio.ensure_future(wait_routed(call(started), HANDLE, patience_s=5))
        await asyncio.sleep(0.6)
        held = not waiting.done()
        started.set_result("a new replica")  # Serve's router sends it there
        routed = await waiting
        never: concurrent.futures.Future[Any] = concurrent.futures.Future()
        gave_up = not await wait_routed(call(never), HANDLE, patience_s=0.3)
        return at_once, held and routed, gave_up

    at_once, waited_and_routed, gave_up = asyncio.run(run())
    assert not at_once
    assert waited_and_routed
    assert gave_up
