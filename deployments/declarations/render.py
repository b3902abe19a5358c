"""The Render deployment as Serve is told of it: its defaults under the user's options."""

from __future__ import annotations

from ray.serve.deployment import Deployment

from deployments.config.graph_config import GraphConfig
from deployments.transport.serve_internals import declared

RENDER = "deployments.render.Render"


def render_deployment(config: GraphConfig) -> Deployment:
    return config.render.applied_to(
        declared(
            RENDER,
            name="Render",
            ray_actor_options={"num_cpus": 0.25},
            max_ongoing_requests=64,
            # Per caller: past this many waiting, 503 + Retry-After at once, not a wait
            # without end (Serve's default is no bound).
            max_queued_requests=1024,
        )
    )
