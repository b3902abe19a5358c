"""Whether a DeploymentHandle's router has any replica to send a request to now.

Serve's router waits, without a deadline, while a deployment has no running
replica: a request that arrives while the one Generate replica restarts its
engine (~40 s on CPU) would hang that long. So every caller of a tier
watches each call until a replica takes it (``wait_routed``), and answers 503
with ``Retry-After`` the moment the router has no replica for it: at once
for a call made while none runs, and within ``ROUTE_CHECK_S`` for a call
made just before the router learnt that the last replica died.

The answer is the router's own: the running replicas the Serve controller
pushes to every handle (long poll), less any the router saw die under a
request, and the deployment config it pushes with them. Reading it costs a
few attribute reads and no call. Ray 2.60 has no public accessor for either;
``serve_internals`` reads them, and if a Ray upgrade moves them the answer is
"unknown" and requests route as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from ray.serve.handle import DeploymentHandle

from deployments.transport.serve_internals import assignment_future, router_view

# How often a call the router holds is checked against the replicas it has;
# the call itself is answered the moment a replica takes it.
ROUTE_CHECK_S = 0.25


def no_replica_to_route_to(handle: DeploymentHandle[Any]) -> bool:
    """True when the router knows of no running replica and none is coming for this request.

    False while unknown: before the router has heard of any replica (a new
    handle, or a deployment still starting), and for a deployment that scales
    to zero, whose queued requests are what make Serve start a replica.
    """
    view = router_view(handle)
    return view is not None and view.running == 0 and view.scales_to_zero is False


async def wait_routed(
    response: Any, handle: DeploymentHandle[Any], patience_s: float = 0.0
) -> bool:
    """Until a replica has taken the call (True), or its router has had none for it
    for ``patience_s`` (False; at once by default).

    ``response`` is what ``handle.<method>.remote(...)`` returned, or wraps it; one
    sent on a request channel (``channel_reader.ChannelStream``, no handle
    response) counts as taken. On False the
    caller cancels it and answers 503. Unknown (a Ray that moved the future)
    counts as taken: the call goes on as Serve runs it. Meanwhile Serve's router
    holds the call, and sends it to the first replica that starts.
    """
    while hasattr(response, "handle_response"):  # a call that wraps the handle's own
        chosen = getattr(response, "chosen", None)
        if chosen is not None:  # a call that may go on a request channel instead
            await chosen()
        response = response.handle_response
    future = assignment_future(response)
    if future is None or future.done():
        return True
    # A concurrent future when the router runs on its own loop (Serve's default).
    waiter: asyncio.Future[Any] = (
        asyncio.wrap_future(future) if isinstance(future, concurrent.futures.Future) else future
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    while not no_replica_to_route_to(handle) or loop.time() < deadline:
        done, _ = await asyncio.wait({waiter}, timeout=ROUTE_CHECK_S)
        if done:
            # The caller reads the outcome from the response; looked at here so that
            # a failed assignment is not also logged as an exception never retrieved.
            if not waiter.cancelled():
                waiter.exception()
            return True
    return False
