"""The Ingress deployment as Serve is told of it: its defaults under the user's options."""

from __future__ import annotations

from ray.serve.deployment import Deployment

from deployments.config.graph_config import GraphConfig
from deployments.transport.serve_internals import declared

INGRESS = "deployments.ingress.Ingress"
# Serve's default for a deployment without num_replicas or autoscaling.
INGRESS_REPLICAS = 1


def ingress_max_replicas(config: GraphConfig) -> int:
    """The most Ingress replicas ``config`` allows: each may hold a step channel on
    every Derender replica."""
    return config.ingress.max_replicas(INGRESS_REPLICAS)


def ingress_deployment(config: GraphConfig) -> Deployment:
    return config.ingress.applied_to(
        declared(
            INGRESS,
            name="Ingress",
            ray_actor_options={"num_cpus": 0.1},
            max_ongoing_requests=1000,
            # Per caller: past this many waiting, 503 + Retry-After at once, not a wait
            # without end (Serve's default is no bound).
            max_queued_requests=2048,
        )
    )
