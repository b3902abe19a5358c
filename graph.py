"""The scaleout-serve deployment graph.

    serve run graph:app                                  # embedded tiny model on CPU
    serve run graph:build_app model=/path/to/hf-model …  # any HF-format model
    serve run configs/local.yaml                         # a Serve config file

``build_app`` validates its args with :class:`deployments.config.graph_config.GraphConfig`
(unknown keys and bad values fail here, before anything starts) and binds
Ingress → Render + Generate + Derender (→ Generate) + the control plane, to which
every Generate and Derender replica subscribes (``deployments/transport/control_channel.py``).
Each deployment's options are declared next to it, in ``deployments/declarations/``
(``*_deployment(config)``), by the import path of its class: building the graph
imports no replica's code and so no vLLM (the ``serve run`` CLI, KubeRay's head);
each replica imports its own. This only binds.

``serve run graph:app`` imports this module before it starts Ray, and every Ray
process it starts inherits this process's environment: so the graph's Serve
switches (``deployments/config/serve_env.py``) that the environment does not name
are set here, and the documented command runs the same graph as ``make run``. (The
``serve run`` CLI has imported Serve by then, so the handles it makes for the graph
carry its own defaults: each replica moves them onto its own data plane,
``transport.serve_internals.on_this_process_data_plane``.) Where
Ray runs already (a config file, ``serve deploy``, an address), the control plane
logs a warning naming the switches its cluster lacks.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.serve import Application

from deployments.config.graph_config import EMBEDDED_DEFAULT, GraphConfig
from deployments.config.serve_env import set_missing_switches
from deployments.declarations.control_plane import control_plane_deployment
from deployments.declarations.derender import derender_deployment, derender_max_replicas
from deployments.declarations.generate import generate_deployment
from deployments.declarations.ingress import ingress_deployment, ingress_max_replicas
from deployments.declarations.render import render_deployment


def build_graph(config: GraphConfig) -> Application:
    """Bind the graph for an already-validated config."""
    control = control_plane_deployment().bind(config.observability.metrics)
    render = render_deployment(config).bind(config)
    # Each Derender replica and each Ingress replica holds a step channel on every
    # Generate replica it streams from, and each Ingress replica one on every Derender
    # replica.
    generate_callers = derender_max_replicas(config) + ingress_max_replicas(config)
    generate = generate_deployment(config, generate_callers).bind(config, control)
    # ... and, with request channels, each Generate replica one on every Derender replica.
    derender_callers = ingress_max_replicas(config)
    if config.request_channels:
        derender_callers += config.generate.max_replicas(1)
    derender = derender_deployment(config, derender_callers)
    return ingress_deployment(config).bind(
        config, render, generate, derender.bind(config, generate, control), control
    )


def build_app(args: dict[str, Any]) -> Application:
    """``serve run graph:build_app key=value …`` and Serve config ``args``."""
    return build_graph(GraphConfig.from_args(args, env=os.environ))


if not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
    set_missing_switches(os.environ)  # before `serve run` starts Ray from this process
app = build_app(EMBEDDED_DEFAULT)
