"""The scaleout-serve deployment graph.

    serve run graph:app                                  # embedded tiny model on CPU
    serve run graph:build_app model=/path/to/hf-model …  # any HF-format model
    serve run configs/local.yaml                         # a Serve config file

``build_app`` validates its args with :class:`deployments.config.graph_config.GraphConfig`
(unknown keys and bad values fail here, before anything starts) and binds
Ingress → Render + Generate + Derender (→ Generate) + ControlPlane, to which
every Generate and Derender replica subscribes (``deployments/control_channel``).
"""

from __future__ import annotations

import os
from typing import Any

from ray.serve import Application
from ray.serve.deployment import Deployment

from deployments.config.graph_config import DeploymentOptions, GraphConfig
from deployments.control_plane import ControlPlane
from deployments.derender import DERENDER_AUTOSCALING, Derender
from deployments.generate import Generate, engine_env
from deployments.ingress import INGRESS_REPLICAS, Ingress
from deployments.render import Render
from deployments.routing.prefix_router import prefix_routing

# The embedded default: the tiny model this repo builds, with its parsers.
EMBEDDED_DEFAULT: dict[str, Any] = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}


def _with_options(
    deployment: Any, opts: DeploymentOptions, actor: dict[str, Any] | None = None
) -> Deployment:
    """The deployment with the config's replicas/resources over its own defaults."""
    actor_options = dict(deployment.ray_actor_options or {})
    actor_options.update(actor or {})
    if opts.num_cpus is not None:
        actor_options["num_cpus"] = opts.num_cpus
    if opts.resources is not None:
        actor_options["resources"] = {**actor_options.get("resources", {}), **opts.resources}
    return deployment.options(ray_actor_options=actor_options, **opts.to_serve())


def _max_replicas(opts: DeploymentOptions, class_default: int) -> int:
    if opts.num_replicas is not None:
        return opts.num_replicas
    return opts.autoscaling.max_replicas if opts.autoscaling is not None else class_default


def build_graph(config: GraphConfig) -> Application:
    """Bind the graph for an already-validated config."""
    render = _with_options(Render, config.render).bind(config)
    generate_actor: dict[str, Any] = {"runtime_env": {"env_vars": engine_env(config)}}
    if config.num_gpus:
        generate_actor["num_gpus"] = config.num_gpus
    # One control plane that every Generate and Derender replica subscribes to.
    control = _with_options(ControlPlane, DeploymentOptions()).bind()
    generate_deployment = _with_options(Generate, config.generate, generate_actor)
    # Each Derender replica holds one step channel call open on every Generate
    # replica it streams from; Serve counts it as an ongoing request, so the
    # channels get slots of their own on top of the requests' (step_channel.py).
    channels = _max_replicas(config.derender, DERENDER_AUTOSCALING["max_replicas"])
    generate_deployment = generate_deployment.options(
        max_ongoing_requests=generate_deployment.max_ongoing_requests + channels
    )
    if config.generate.routing_policy() == "prefix":
        thresholds = config.generate.prefix_routing
        generate_deployment = generate_deployment.options(
            request_router_config=prefix_routing(
                imbalance=thresholds.imbalance,
                min_match_ratio=thresholds.min_match_ratio,
                stats_period_s=thresholds.stats_period_s,
                engine_events=thresholds.engine_events,
            )
        )
    generate = generate_deployment.bind(config, control)
    derender_deployment = _with_options(Derender, config.derender)
    # And each Ingress replica holds one on every Derender replica.
    derender_deployment = derender_deployment.options(
        max_ongoing_requests=derender_deployment.max_ongoing_requests
        + _max_replicas(config.ingress, INGRESS_REPLICAS)
    )
    derender = derender_deployment.bind(config, generate, control)
    return _with_options(Ingress, config.ingress).bind(config, render, generate, derender, control)


def build_app(args: dict[str, Any]) -> Application:
    """``serve run graph:build_app key=value …`` and Serve config ``args``."""
    return build_graph(GraphConfig.from_args(args, env=os.environ))


app = build_app(EMBEDDED_DEFAULT)
