"""The Generate deployment as Serve is told of it: its replicas and resources, its
engine's environment and GPUs, how callers choose a replica, and a slot per caller
that may hold a step channel on a replica."""

from __future__ import annotations

import os
from typing import Any

from ray.serve.deployment import Deployment

from deployments.config.graph_config import GraphConfig
from deployments.routing.pinned_router import PINNED_ROUTING
from deployments.routing.prefix_router import prefix_routing
from deployments.transport.serve_internals import declared
from deployments.transport.step_channel import with_channel_slots

GENERATE = "deployments.generate.Generate"


def engine_env(config: GraphConfig) -> dict[str, str]:
    """Environment the engine reads at start; set per replica, never at import."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib)} if config.num_gpus == 0 else {}
    # Two engines on one small host must not pin the same cores.
    env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def generate_deployment(config: GraphConfig, channel_callers: int) -> Deployment:
    """Generate as ``config`` asks for it, with a slot on each replica for each of the
    ``channel_callers`` replicas that may hold a step channel there (Serve counts a
    channel call as an ongoing request; ``step_channel.py``)."""
    actor: dict[str, Any] = {"runtime_env": {"env_vars": engine_env(config)}}
    if config.num_gpus:
        actor["num_gpus"] = config.num_gpus
    deployment = config.generate.applied_to(
        declared(
            GENERATE,
            name="Generate",
            ray_actor_options={"num_cpus": 1},
            max_ongoing_requests=256,
            # Per caller: past this many waiting, 503 + Retry-After at once, not a wait
            # without end (Serve's default is no bound).
            max_queued_requests=1024,
            health_check_period_s=10,
            health_check_timeout_s=30,
            graceful_shutdown_timeout_s=5,
            # A stopping replica hands its streams over within ENGINE_WATCH_S
            # (EngineCalls.leave); Serve then checks every this often whether it holds
            # any (default 2 s), and what is left of the 5 s goes to the engine's exit.
            graceful_shutdown_wait_loop_s=0.5,
            request_router_config=PINNED_ROUTING,
        ),
        actor,
    )
    deployment = with_channel_slots(deployment, channel_callers)
    if config.generate.routing_policy() == "prefix":
        thresholds = config.generate.prefix_routing
        deployment = deployment.options(
            request_router_config=prefix_routing(
                imbalance=thresholds.imbalance,
                min_match_ratio=thresholds.min_match_ratio,
                stats_period_s=thresholds.stats_period_s,
                engine_events=thresholds.engine_events,
            )
        )
    return deployment
