"""The Derender deployment as Serve is told of it: autoscaled, pinned routing, and a
slot per caller that may hold a step channel on a replica."""

from __future__ import annotations

from typing import Any

from ray.serve.deployment import Deployment

from deployments.config.graph_config import GraphConfig
from deployments.routing.pinned_router import PINNED_ROUTING
from deployments.transport.serve_internals import declared
from deployments.transport.step_channel import with_channel_slots

DERENDER = "deployments.derender.Derender"
DERENDER_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 4,
    "target_ongoing_requests": 8,
    "upscale_delay_s": 2,
    "downscale_delay_s": 10,
}


# Long enough for a long reasoning stream on a GPU engine.
DERENDER_DRAIN_S = 600


def derender_max_replicas(config: GraphConfig) -> int:
    """The most Derender replicas ``config`` allows: each may hold a step channel on
    every Generate replica."""
    return config.derender.max_replicas(DERENDER_AUTOSCALING["max_replicas"])


def derender_deployment(config: GraphConfig, channel_callers: int) -> Deployment:
    """Derender as ``config`` asks for it, with a slot on each replica for each of the
    ``channel_callers`` (Ingress replicas) that may hold a step channel there."""
    deployment = config.derender.applied_to(
        declared(
            DERENDER,
            name="Derender",
            ray_actor_options={"num_cpus": 0.25},
            max_ongoing_requests=64,
            # Per caller: past this many waiting, 503 + Retry-After at once, not a wait
            # without end (Serve's default is no bound).
            max_queued_requests=1024,
            autoscaling_config=DERENDER_AUTOSCALING,
            # A replica Serve stops finishes its streams (their text state is here)
            # and then ends its step channels (transport/leaving.py): Serve's wait
            # lasts as long as its longest stream, up to this, not Serve's 20 s.
            graceful_shutdown_timeout_s=DERENDER_DRAIN_S,
            graceful_shutdown_wait_loop_s=0.5,
            request_router_config=PINNED_ROUTING,
        )
    )
    return with_channel_slots(deployment, channel_callers)
