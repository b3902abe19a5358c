"""The control plane deployment, ``AbortFanout``, as Serve is told of it."""

from __future__ import annotations

from ray.serve.deployment import Deployment

from deployments.transport.serve_internals import declared

CONTROL_PLANE = "deployments.control_plane.ControlPlane"


def control_plane_deployment() -> Deployment:
    """One small replica; of the user's config, only ``observability.metrics``
    reaches it (bound with the class)."""
    return declared(
        CONTROL_PLANE,
        name="AbortFanout",
        num_replicas=1,
        # Not 0: a head started with num-cpus 0 (as KubeRay's) keeps only actors that ask
        # for CPUs off it, and no replica of the graph belongs on the head.
        ray_actor_options={"num_cpus": 0.01},
        # One subscription per data-plane replica, plus the control calls themselves.
        max_ongoing_requests=1000,
        # The subscriptions never end by themselves; shutting down need not wait for them.
        graceful_shutdown_timeout_s=1,
    )
