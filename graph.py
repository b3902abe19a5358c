"""The scaleout-serve deployment graph.

    serve run graph:app                                  # embedded tiny model on CPU
    serve run graph:build_app model=/path/to/hf-model …  # any HF-format model
    serve run configs/local.yaml                         # a Serve config file

``build_app`` validates its args with :class:`deployments.config.graph_config.GraphConfig`
(unknown keys and bad values fail here, before anything starts) and binds
Ingress → Render + Generate + Derender (→ Generate) + the control plane, to which
every Generate and Derender replica subscribes (``deployments/transport/control_channel.py``).
Each deployment module owns its options (``*_deployment(config)``); this only binds.
"""

from __future__ import annotations

import os
from typing import Any

from ray.serve import Application

from deployments.config.graph_config import GraphConfig
from deployments.control_plane import control_plane_deployment
from deployments.derender import derender_deployment, derender_max_replicas
from deployments.generate import generate_deployment
from deployments.ingress import ingress_deployment, ingress_max_replicas
from deployments.render import render_deployment

# The embedded default: the tiny model this repo builds, with its parsers.
EMBEDDED_DEFAULT: dict[str, Any] = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}


def build_graph(config: GraphConfig) -> Application:
    """Bind the graph for an already-validated config."""
    control = control_plane_deployment().bind()
    render = render_deployment(config).bind(config)
    # Each Derender replica holds a step channel on every Generate replica it streams
    # from, and each Ingress replica one on every Derender replica.
    generate = generate_deployment(config, derender_max_replicas(config)).bind(config, control)
    derender = derender_deployment(config, ingress_max_replicas(config))
    return ingress_deployment(config).bind(
        config, render, generate, derender.bind(config, generate, control), control
    )


def build_app(args: dict[str, Any]) -> Application:
    """``serve run graph:build_app key=value …`` and Serve config ``args``."""
    return build_graph(GraphConfig.from_args(args, env=os.environ))


app = build_app(EMBEDDED_DEFAULT)
