"""The named topologies of ``configs/`` and the GPU profile they share.

``configs/<T>.yaml`` is each topology on the CPU-local default. A topology is
how clients use the graph as much as how it is configured: configs differ only
in their switches, and T and I, and B and S, have the same config (T asks
``/inference/v1/generate`` for text where I asks ``/v1/chat/completions``; B
calls vLLM's per-chunk ``/derender`` where S streams tier chat). The GPU variant of a topology is
``configs/gpu.yaml`` with that topology's switches swapped in: the one rule
that the k8s overlays and the GPU benchmark both use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TOPOLOGIES = ("G", "T", "B", "BP", "S", "I")
# What makes a topology; everything else comes from the profile.
SWITCHES = ("tokens_only", "text_placement", "reasoning_parser", "tool_call_parser")


def serve_config(path: Path) -> dict[str, Any]:
    """A Serve config file as a mapping."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def app_config(path: Path) -> dict[str, Any]:
    """The (single) application of a Serve config file."""
    return dict(serve_config(path)["applications"][0])


def gpu_topology_app(configs: Path, topology: str) -> dict[str, Any]:
    """The GPU profile's application with ``topology``'s switches."""
    gpu = app_config(configs / "gpu.yaml")
    local_args = app_config(configs / f"{topology}.yaml")["args"]
    args = {k: v for k, v in gpu["args"].items() if k not in SWITCHES}
    args.update({k: local_args[k] for k in SWITCHES if k in local_args})
    return {**gpu, "args": args}
