"""When a call is answered 503 rather than left waiting in Serve's router.

The router state here is a stand-in with the attributes Ray 2.60's router
keeps (``deployments/routable.py`` reads them); that Ray really keeps them is
what ``tests/integration/test_engine_death.py`` checks on a real graph.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any

from ray.serve._private.config import DeploymentConfig
from ray.serve.config import AutoscalingConfig

from deployments.routable import no_replica_to_route_to, wait_routed


def handle(replicas: int | None, min_replicas: int | None = None, told: bool = True) -> Any:
    """A handle whose router knows ``replicas`` running replicas (None: not told yet)."""
    config = DeploymentConfig(
        autoscaling_config=None
        if min_replicas is None
        else AutoscalingConfig(min_replicas=min_replicas, max_replicas=2)
    )
    router = SimpleNamespace(
        running_replicas_populated=lambda: told,
        _request_router=None
        if replicas is None
        else SimpleNamespace(curr_replicas={f"r{i}": object() for i in range(replicas)}),
        _running_replicas=None,
        _metrics_manager=SimpleNamespace(_deployment_config=config),
    )
    return SimpleNamespace(_router=SimpleNamespace(_asyncio_router=router))


def call(assignment: concurrent.futures.Future[Any]) -> Any:
    """A handle call's response: its replica assignment is a future (Serve's own loop)."""
    return SimpleNamespace(_replica_result_future=assignment)


def test_no_replica_means_503_only_when_the_router_knows_and_none_is_coming() -> None:
    assert no_replica_to_route_to(handle(0))
    assert no_replica_to_route_to(handle(0, min_replicas=1))
    assert not no_replica_to_route_to(handle(1))
    # Scaling from zero: queued calls are what make Serve start a replica.
    assert not no_replica_to_route_to(handle(0, min_replicas=0))
    # Never told of a replica (a deployment still starting), or a Ray that moved
    # its router state: the call waits as Serve would have it wait.
    assert not no_replica_to_route_to(handle(0, told=False))
    assert not no_replica_to_route_to(SimpleNamespace(_router=None))
    assert not no_replica_to_route_to(handle(None))


def test_a_call_the_router_holds_gives_up_once_no_replica_is_left() -> None:
    async def run() -> tuple[bool, bool]:
        router = handle(1)
        pending: concurrent.futures.Future[Any] = concurrent.futures.Future()
        waiting = asyncio.ensure_future(wait_routed(call(pending), router))
        await asyncio.sleep(0.3)
        held = not waiting.done()
        router._router._asyncio_router._request_router.curr_replicas.clear()  # the last one died
        return held, await waiting

    held, routed = asyncio.run(run())
    assert held, "gave up while a replica was still there"
    assert not routed


def test_a_call_a_replica_takes_is_routed_at_once() -> None:
    async def run() -> bool:
        pending: concurrent.futures.Future[Any] = concurrent.futures.Future()
        waiting = asyncio.ensure_future(wait_routed(call(pending), handle(1)))
        await asyncio.sleep(0)
        pending.set_exception(RuntimeError("assignment failed"))  # the caller reads it later
        return await asyncio.wait_for(waiting, 1)

    assert asyncio.run(run())
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.set_result(None)
    assert asyncio.run(wait_routed(call(done), handle(0)))
