"""Start a named topology from ``configs/``, as a user would.

Profile ``local`` runs ``configs/<name>.yaml`` (the CPU-local default);
profile ``gpu`` runs ``configs/gpu.yaml`` with that topology's switches, as
the k8s overlays do. The config runs as written except for what a benchmark
host must change: a free port and, optionally, the KV cache size and any
graph arg (``--set generate.num_cpus=0.5``). Several local topologies can also run
side by side in one ``serve run``, each as its own application under
``/<topology>`` (``running_topologies``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.harness.servers import (
    REPO,
    SERVE_RUN_STOP_GRACE_S,
    VENV_BIN,
    free_port,
    graph_env,
    running,
)
from deployments.config.graph_config import nest_dotted
from deployments.config.serve_env import SERVE_ENV
from deployments.config.topologies import app_config, gpu_topology_app, serve_config

CONFIGS = REPO / "configs"


@dataclass(frozen=True)
class Overrides:
    """What the benchmark changes in a topology's config."""

    profile: str = "local"
    """``local`` (configs/<topology>.yaml) or ``gpu`` (configs/gpu.yaml + switches)."""
    kv_cache_gib: float | None = None
    args: Mapping[str, str] = field(default_factory=dict)
    """Graph args over the config's, dotted keys nesting (``generate.num_cpus``)."""


def topology_config(name: str, port: int, overrides: Overrides) -> dict[str, Any]:
    if overrides.profile == "gpu":
        config = serve_config(CONFIGS / "gpu.yaml")
        config["applications"] = [gpu_topology_app(CONFIGS, name)]
    else:
        config = serve_config(CONFIGS / f"{name}.yaml")
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"] = nest_dotted({**app["args"], **overrides.args})
    if overrides.kv_cache_gib is not None:
        app["args"]["kv_cache_gib"] = overrides.kv_cache_gib
    return config


def app_name(name: str) -> str:
    return str(app_config(CONFIGS / f"{name}.yaml")["name"])


@contextlib.contextmanager
def running_topology(
    name: str, work_dir: Path, overrides: Overrides, *, serve_switches: bool = True
) -> Iterator[str]:
    """``serve run`` the topology; yields its base URL once /health is 200. Without
    ``serve_switches``, as a user's plain ``serve run configs/<name>.yaml``: Ray starts
    without the graph's Serve switches."""
    port = free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology_config(name, port, overrides)))
    with running(
        [str(VENV_BIN / "serve"), "run", str(path)],
        port=port,
        log_path=work_dir / f"{name}.serve.log",
        env=graph_env(switches=serve_switches),
        unset=() if serve_switches else tuple(SERVE_ENV),
        stop_grace_s=SERVE_RUN_STOP_GRACE_S,
    ) as server:
        yield server.base_url


def topologies_config(names: list[str], port: int, overrides: Overrides) -> dict[str, Any]:
    """One Serve config running each local topology as its own application, named
    and routed by the topology (``/s``, ``/bp``), beside the others. The files must
    agree on all but their application, as configs/ does."""
    configs = {name: topology_config(name, port, overrides) for name in names}
    shell = {k: v for k, v in configs[names[0]].items() if k != "applications"}
    for name, config in configs.items():
        if {k: v for k, v in config.items() if k != "applications"} != shell:
            message = f"configs/{name}.yaml differs from configs/{names[0]}.yaml outside its app"
            raise ValueError(message)
    apps = []
    for name, config in configs.items():
        (app,) = config["applications"]
        apps.append({**app, "name": name.lower(), "route_prefix": f"/{name.lower()}"})
    return {**shell, "applications": apps}


@contextlib.contextmanager
def running_topologies(
    names: list[str], work_dir: Path, overrides: Overrides, *, serve_switches: bool = True
) -> Iterator[dict[str, str]]:
    """``serve run`` the local topologies side by side (``topologies_config``); yields
    each one's base URL once all are healthy. ``serve_switches`` as ``running_topology``."""
    port = free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "topologies.yaml"
    path.write_text(yaml.safe_dump(topologies_config(names, port, overrides)))
    prefixes = {name: f"/{name.lower()}" for name in names}
    with running(
        [str(VENV_BIN / "serve"), "run", str(path)],
        port=port,
        log_path=work_dir / "topologies.serve.log",
        health_paths=[f"{prefix}/health" for prefix in prefixes.values()],
        env=graph_env(switches=serve_switches),
        unset=() if serve_switches else tuple(SERVE_ENV),
        stop_grace_s=SERVE_RUN_STOP_GRACE_S,
    ) as server:
        yield {name: server.base_url + prefix for name, prefix in prefixes.items()}
