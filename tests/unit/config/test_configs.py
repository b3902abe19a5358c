"""Every Serve config in configs/: Serve's schema, no unknown keys, args our config accepts."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from ray.serve.schema import ServeDeploySchema

from bench.harness.servers import REPO
from deployments.config.graph_config import GraphConfig
from deployments.config.topologies import TOPOLOGIES

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``list[X]``, ``X | None``; else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = model_in(arg)
        if found is not None:
            return found
    return None


def unknown_keys(data: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """Keys the model does not declare, recursively (ServeDeploySchema ignores them)."""
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            out.append(f"{where}{key}")
            continue
        inner = model_in(field.annotation)
        if inner is None:
            continue
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            out += unknown_keys(item, inner, f"{where}{key}[{i}].")
    return out


def test_every_topology_has_a_config() -> None:
    assert {p.stem for p in CONFIGS} >= set(TOPOLOGIES) | {"local", "gpu"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_is_valid(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(data)
    assert unknown_keys(data, ServeDeploySchema) == []
    for app in schema.applications:
        assert app.import_path == "graph:build_app"
        GraphConfig.from_args(app.args)


def test_unknown_key_checker_catches_typos() -> None:
    data = {
        "applications": [
            {
                "import_path": "graph:build_app",
                "deployments": [{"name": "Generate", "num_replica": 2}],
            }
        ],
        "http_option": {},
    }
    assert ServeDeploySchema.model_validate(data)  # Serve itself lets them through
    assert sorted(unknown_keys(data, ServeDeploySchema)) == [
        "applications[0].deployments[0].num_replica",
        "http_option",
    ]


def _deployments(app: Any) -> dict[str, Any]:
    """The bound deployments of a built graph, by name (Serve's own objects)."""
    ingress = app._bound_deployment
    bound = [getattr(arg, "_bound_deployment", None) for arg in ingress.init_args]
    return {d.name: d for d in [ingress, *bound] if d is not None}


TIERS = ("Ingress", "Render", "Generate", "Derender")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds_its_graph(path: Path) -> None:
    """``build_app`` of each file's args: every tier is there, built from this file's
    config, with the replicas, autoscaling and resources the file asks for."""
    from graph import build_app

    args = yaml.safe_load(path.read_text())["applications"][0]["args"]
    config = GraphConfig.from_args(args)
    deployments = _deployments(build_app(args))
    assert set(deployments) == {*TIERS, "AbortFanout"}
    for name in TIERS:
        deployment = deployments[name]
        built_with = [a for a in deployment.init_args if isinstance(a, GraphConfig)]
        assert built_with == [config], name
        options = getattr(config, name.lower())
        actor = deployment.ray_actor_options
        if options.num_cpus is not None:
            assert actor["num_cpus"] == options.num_cpus, name
        if options.resources is not None:
            assert actor["resources"] == options.resources, name
        if options.num_replicas is not None:
            assert deployment.num_replicas == options.num_replicas, name
        autoscaling = deployment._deployment_config.autoscaling_config
        if options.autoscaling is not None:
            assert autoscaling is not None, name
            assert (autoscaling.min_replicas, autoscaling.max_replicas) == (
                options.autoscaling.min_replicas,
                options.autoscaling.max_replicas,
            ), name
        # Every tier's queue is bounded (Serve's default is none): overload is a 503.
        want = options.max_queued_requests
        assert (
            deployment.max_queued_requests == want
            if want is not None
            else (deployment.max_queued_requests > 0)
        ), name
    generate = deployments["Generate"].ray_actor_options
    assert generate.get("num_gpus", 0) == config.num_gpus
    # A CPU engine gets its KV cache size; a GPU one sizes its own.
    env = generate["runtime_env"]["env_vars"]
    assert ("VLLM_CPU_KVCACHE_SPACE" in env) == (config.num_gpus == 0)


@pytest.mark.parametrize(
    ("args", "slots"),
    [
        ({"generate.max_ongoing_requests": "5", "derender.num_replicas": "2"}, 5 + 2 + 1),
        ({"generate.max_ongoing_requests": "1"}, 1 + 4 + 1),  # Derender autoscales to 4
        ({"derender.autoscaling.max_replicas": "6"}, 256 + 6 + 1),
        ({"ingress.num_replicas": "3"}, 256 + 4 + 3),
    ],
)
def test_generate_gets_a_slot_per_step_channel(args: dict[str, str], slots: int) -> None:
    # Each Derender replica and each Ingress replica holds one step channel open on
    # every Generate replica: without a slot of its own it would take a request's.
    from graph import build_app

    assert _deployments(build_app(args))["Generate"].max_ongoing_requests == slots


@pytest.mark.parametrize(("args", "slots"), [({}, 64 + 1), ({"ingress.num_replicas": "3"}, 64 + 3)])
def test_derender_gets_a_slot_per_ingress_step_channel(args: dict[str, str], slots: int) -> None:
    from graph import build_app

    assert _deployments(build_app(args))["Derender"].max_ongoing_requests == slots
