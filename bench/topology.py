"""Start a named topology from its ``configs/<name>.yaml``, as a user would.

The config runs as written except for what a benchmark host must change: a
free port, optionally the KV cache size, and optionally the Derender tier's
autoscaling bounds (the autoscaling ramp).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.servers import REPO, VENV_BIN, free_port, running

CONFIGS = REPO / "configs"


@dataclass(frozen=True)
class Overrides:
    """What the benchmark changes in a topology's config."""

    kv_cache_gib: float | None = None
    derender_autoscaling: dict[str, Any] | None = None


def topology_config(name: str, port: int, overrides: Overrides) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    if overrides.kv_cache_gib is not None:
        args["kv_cache_gib"] = overrides.kv_cache_gib
    if overrides.derender_autoscaling is not None:
        derender = args.setdefault("derender", {})
        derender.pop("num_replicas", None)
        derender["autoscaling"] = {
            **derender.get("autoscaling", {}),
            **overrides.derender_autoscaling,
        }
    return config


def app_name(name: str) -> str:
    config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    return str(config["applications"][0]["name"])


@contextlib.contextmanager
def running_topology(name: str, work_dir: Path, overrides: Overrides) -> Iterator[str]:
    """``serve run`` the topology; yields its base URL once /health is 200."""
    port = free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology_config(name, port, overrides)))
    with running(
        [str(VENV_BIN / "serve"), "run", str(path)],
        port=port,
        log_path=work_dir / f"{name}.serve.log",
        env={"RAY_USAGE_STATS_ENABLED": "0"},
    ) as server:
        yield server.base_url
