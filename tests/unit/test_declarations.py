"""How each deployment is declared to Serve (``deployments/declarations/``): by the
import path of its class, so building the graph imports none of the replicas' code."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from deployments.declarations.control_plane import CONTROL_PLANE
from deployments.declarations.derender import DERENDER
from deployments.declarations.generate import GENERATE
from deployments.declarations.ingress import INGRESS
from deployments.declarations.render import RENDER
from deployments.transport.serve_internals import replica_class
from tests.support.imports import heavy_modules_after


def test_building_the_graph_imports_no_vllm() -> None:
    """``serve run graph:app`` imports graph.py in the CLI (and a config's build task
    does on the head): without vLLM, ~2 s and ~150 MB rather than ~12 s and ~660 MB."""
    assert heavy_modules_after("import graph; graph.build_app({'text_placement': 'tier'})") == []


def test_the_ingress_replica_module_imports_no_vllm() -> None:
    """The Ingress passes bodies on and reads plain replies (``messages/replies.py``);
    its replica starts without vLLM and torch. (That no answer loads them later:
    ``tests/integration/test_ingress_without_vllm.py``.)"""
    assert heavy_modules_after("import deployments.ingress") == []


@pytest.mark.parametrize(
    ("path", "module", "name"),
    [
        (INGRESS, "deployments.ingress", "Ingress"),
        (RENDER, "deployments.render", "Render"),
        (GENERATE, "deployments.generate", "Generate"),
        (DERENDER, "deployments.derender", "Derender"),
        (CONTROL_PLANE, "deployments.control_plane", "ControlPlane"),
    ],
)
def test_each_declared_path_is_the_class_a_replica_runs(path: str, module: str, name: str) -> None:
    """Serve's replica loader finds the class itself, not a ``Deployment`` (whose
    options Serve would ignore with a warning) and not a typo found only at start."""
    from ray.serve.deployment import Deployment

    loaded: Any = replica_class(path)
    assert isinstance(loaded, type) and not isinstance(loaded, Deployment)
    assert loaded is getattr(sys.modules[module], name)
