"""Runs each ``serve_internals`` read inside a real Serve replica and prints what it saw.

    python -m tests.support.serve_door_probe      (tests/integration/test_serve_internals.py)

A local Ray instance of its own (``address="local"``) with the graph's Serve
switches, no HTTP proxy: ``Probe`` holds a handle to ``Target`` and, from
inside its replica as the graph's tiers do, moves a handle made by reference
onto its own data plane, reads the router state, a call's
assignment future, its own actor's liveness ping and Serve's replica log
handlers, and has Serve's router pick Target's replicas without a call; a
``Leaver`` replica reads its draining flag while Serve stops it, and a
``Quiet`` one counts its calls' access log lines before and after it drops them.
One JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from typing import Any

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.transport import serve_internals as door


@serve.deployment(
    name="Target", num_replicas=2, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=7
)
class Target:
    async def __call__(self) -> str:
        await asyncio.sleep(0.2)
        return "ok"

    def identity(self) -> tuple[str, int]:
        """This replica's unique id, and its max_ongoing_requests as the door reads it."""
        context = serve.get_replica_context()
        return context.replica_id.unique_id, door.replica_max_ongoing_requests()


@serve.deployment(
    name="ZeroTarget",
    ray_actor_options={"num_cpus": 0},
    autoscaling_config={"min_replicas": 0, "max_replicas": 1, "initial_replicas": 1},
)
class ZeroTarget:
    async def __call__(self) -> str:
        return door.serve_request_id()


@serve.deployment(name="Leaver", ray_actor_options={"num_cpus": 0})
class Leaver:
    """Says what ``draining_probe`` reads, then waits until it turns, while its
    application is deleted."""

    async def watch(self) -> Any:
        draining = door.draining_probe()
        yield draining()
        for _ in range(600):  # a minute at most: Serve gives it 20 s by default
            if draining():
                yield True
                return
            await asyncio.sleep(0.1)


@serve.deployment(name="Quiet", ray_actor_options={"num_cpus": 0})
class Quiet:
    """Counts Serve's access log records of its calls that reach its logger's handlers,
    before and after ``drop_access_log_lines``."""

    def __init__(self) -> None:
        self._lines = 0

    def watch(self) -> None:
        """Count from now on, in a handler ahead of Serve's own: they take the
        ``serve_access_log`` mark off each record they handle
        (``ServeLogAttributeRemovalFilter``), so a handler after them sees none."""
        handler = logging.Handler()
        handler.emit = self._saw  # type: ignore[method-assign]
        logging.getLogger(door.serve_logger_name()).handlers.insert(0, handler)

    def _saw(self, record: logging.LogRecord) -> None:
        if getattr(record, "serve_access_log", False):
            self._lines += 1

    def ping(self) -> None:
        return None

    def drop(self) -> None:
        door.drop_access_log_lines()

    def lines(self) -> int:
        return self._lines


@serve.deployment(name="Probe", ray_actor_options={"num_cpus": 0})
class Probe:
    def __init__(self, target: DeploymentHandle, zero: DeploymentHandle) -> None:
        self._target = target
        self._zero = zero

    async def check(self, made_by_reference: DeploymentHandle) -> dict[str, Any]:
        seen: dict[str, Any] = {"view_before_any_call": _view(door.router_view(self._target))}
        # A handle made where Serve's default is by reference, as the `serve run` CLI
        # makes the graph's before graph.py sets the switches.
        own = door.on_this_process_data_plane(made_by_reference)
        calls = {"made": made_by_reference.remote(), "own": own.remote()}
        seen["by_reference"] = {name: c.by_reference for name, c in calls.items()}
        seen["answers_on_own_plane"] = [await c for c in calls.values()]
        response = self._target.remote()
        future = door.assignment_future(response)
        seen["assignment_future"] = type(future).__name__
        if isinstance(future, concurrent.futures.Future):
            await asyncio.wrap_future(future)
        elif future is not None:
            await future
        seen["answer"] = await response
        seen["view"] = _view(door.router_view(self._target))
        seen["request_id"] = door.serve_request_id()
        seen["callee_request_id"] = await self._zero.remote()
        seen["zero_view"] = _view(door.router_view(self._zero))
        await door.ping_actor(ray.get_runtime_context().current_actor)
        seen["pinged"] = True
        seen["logger"] = door.serve_logger_name()
        seen["log_buffers"] = len(door.replica_log_buffers())
        seen["log_buffer_targets"] = [
            type(h.target).__name__ for h in door.replica_log_buffers() if h.target is not None
        ]
        seen["grpc_cap"] = door.replica_grpc_max_message_bytes()
        seen["picks"] = await self._picks()
        seen["request_fields"] = list(door.serve_request_fields())
        seen["entered_request_id"] = await _in_fresh_context(
            lambda: (
                door.enter_serve_request(("/x", "entered-id", "door")),
                door.serve_request_id(),
            )[1]
        )
        return seen

    async def _picks(self) -> dict[str, Any]:
        """``pick_replica``'s picks (nothing sent): replica ids of Target's, and the
        replicas' own ids and max_ongoing_requests, from calls that Serve routes."""
        picked = {await door.pick_replica(self._target, loads={}) for _ in range(20)}
        identities = {tuple(await self._target.identity.remote()) for _ in range(20)}
        return {
            "picked": sorted(p for p in picked if p is not None),
            "none": None in picked,
            "ids": sorted(i for i, _ in identities),
            "max_ongoing": sorted({m for _, m in identities}),
        }


async def _in_fresh_context(run: Any) -> Any:
    """``run()`` in a task whose context holds no Serve request, as a request channel's
    task on the callee is."""
    import contextvars

    async def task() -> Any:
        return run()

    return await contextvars.Context().run(asyncio.create_task, task())


def _view(view: door.RouterView | None) -> Any:
    return None if view is None else {"running": view.running, "zero": view.scales_to_zero}


async def probe() -> dict[str, Any]:
    # No serve.shutdown at the end: it drains deployment by deployment (~7 s), and
    # ray.shutdown in main ends this private Ray instance, Serve's actors with it.
    serve.start(proxy_location="Disabled")
    app = Probe.bind(Target.bind(), ZeroTarget.bind())
    handle = serve.run(app, name="door", route_prefix=None)
    # Under the graph's switches a handle routes on its caller's event loop.
    made_by_reference = serve.get_deployment_handle("Target", "door").options(_by_reference=True)
    seen: dict[str, Any] = await handle.check.remote(made_by_reference)
    seen["proxy_request_id"] = door.proxy_request_id()
    seen["draining"] = await _draining_seen()
    seen["access_lines"] = await _access_lines_seen()
    return seen


async def _access_lines_seen() -> dict[str, int]:
    """Serve's access lines a replica's handlers got for three calls before
    ``drop_access_log_lines`` and for three after."""
    quiet = serve.run(Quiet.bind(), name="quiet", route_prefix=None)
    await quiet.watch.remote()
    for _ in range(3):
        await quiet.ping.remote()
    before = await quiet.lines.remote()
    await quiet.drop.remote()
    dropped = await quiet.lines.remote()
    for _ in range(3):
        await quiet.ping.remote()
    return {"before": before, "after": await quiet.lines.remote() - dropped}


async def _draining_seen() -> list[bool]:
    """What a replica's ``draining_probe`` says before and while Serve stops it."""
    leaver = serve.run(Leaver.bind(), name="leaver", route_prefix=None)
    watch = leaver.options(stream=True).watch.remote()
    seen: list[bool] = [await anext(watch)]
    # The replica is running the call: now stop it.
    deleting = asyncio.create_task(asyncio.to_thread(serve.delete, "leaver"))
    seen.extend([draining async for draining in watch])
    await deleting
    return seen


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        print(json.dumps(asyncio.run(probe())), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
