"""A request router for tiers with step channels: Serve's power of two choices,
plus pinned calls.

A step channel (``step_channel.py``) must reach the one replica that holds
the caller's streams, and Serve routes every handle call by load. A
call that names a replica (``replica=<unique id>``, a keyword argument the
method also receives and checks) goes to that replica; every other call is
routed as Serve routes it by default. If the named replica is gone, the call
goes to any replica, which refuses it, so the caller gets an error at once
instead of a call the router holds forever.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import (
    LocalityMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

from deployments.transport.serve_internals import PICKING

# The keyword argument of a call that names replicas to keep away from.
AVOID = "avoid"


# No FIFOMixin: it hands a chosen replica to the oldest waiting request, which
# would give a pinned call's replica to another call.
class PinnedRouter(LocalityMixin, RequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        pinned: Any = None if pending_request is None else pending_request.kwargs.get("replica")
        if pinned is not None:
            named = [r for r in candidate_replicas if r.replica_id.unique_id == pinned]
            return [named] if named else [candidate_replicas]
        candidate_replicas = without_avoided(candidate_replicas, pending_request)
        # Serve's default: two random replicas (same node first); the router
        # probes both and sends to the shorter queue.
        local = self.apply_locality_routing(pending_request)
        pool = [r for r in candidate_replicas if r.replica_id in local] or candidate_replicas
        two = random.sample(pool, min(2, len(pool)))
        loads = picked_loads(pending_request)
        if loads is not None:
            # A pick probes nothing and takes the first: the one of the two where the
            # picking caller has fewer requests in flight.
            two.sort(key=lambda r: loads.get(r.replica_id.unique_id, 0))
        return [two]


def picked_loads(pending: PendingRequest | None) -> dict[str, int] | None:
    """For a pick (``serve_internals.pick_replica``: Serve's router orders the replicas,
    probes none, sends nothing), the picking caller's requests in flight by replica
    unique id; None for a call."""
    loads: Any = None if pending is None else pending.kwargs.get(PICKING)
    return loads if isinstance(loads, dict) else None


def avoiding(avoid: tuple[str, ...]) -> dict[str, Any]:
    """A call's keyword arguments that ask the router to keep away from the replicas
    ``avoid`` names (read back by ``without_avoided``); none if it names none."""
    return {AVOID: avoid} if avoid else {}


def without_avoided(
    candidates: list[RunningReplica], pending: PendingRequest | None
) -> list[RunningReplica]:
    """The candidates but those the call asks to avoid (``avoid=(<unique id>, ...)``,
    a keyword argument the method also receives): replicas whose engine died under
    the call's stream, which Serve still lists until their actor is gone. All of
    them if that would leave none."""
    avoid: Any = () if pending is None else pending.kwargs.get(AVOID) or ()
    if not avoid:
        return candidates
    kept = [r for r in candidates if r.replica_id.unique_id not in avoid]
    return kept or candidates


# Ray 2.60 annotates RequestRouterConfig's **kwargs as dict values; the field takes a class.
PINNED_ROUTING = RequestRouterConfig(request_router_class=PinnedRouter)  # type: ignore[arg-type]
