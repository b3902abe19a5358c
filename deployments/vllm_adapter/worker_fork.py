"""An engine's worker forked from its EngineCore process, as ``vllm serve`` starts it.

vLLM starts an engine's processes with Python's multiprocessing, by fork unless fork
is unsafe. In a Ray actor it is (the actor's threads and Ray's own state), so when the
Generate replica starts its engine, vLLM spawns the EngineCore process and records
the choice as ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in the replica's environment.
The EngineCore inherits that and spawns its worker too: a fresh interpreter that
imports vLLM and torch again (~10 s of CPU; ~20 s of wall time on a busy 2-core
host), although the EngineCore is no Ray actor and ``vllm serve`` forks the same
worker from the same kind of process.

``fork_engine_workers`` is a vLLM general plugin (``pyproject.toml``, entry point
group ``vllm.general_plugins``): vLLM loads it in every process it starts, in the
EngineCore before the executor starts the worker. In an EngineCore that a Generate
replica started, it puts back the method the replica had before vLLM changed it
(``ENGINE_WORKER_START``, written by the replica; fork unless the user chose
otherwise). vLLM's own check still runs after it and forces spawn wherever fork is
unsafe (a Ray actor, CUDA already initialized).
"""

from __future__ import annotations

import os
import sys

# Written by the Generate replica before it starts its engine: the start method its
# environment named then (vLLM's default, fork, if none).
ENGINE_WORKER_START = "SCALEOUT_ENGINE_WORKER_START"
_VLLM_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


def remember_worker_start() -> None:
    """In the Generate replica, before its engine starts: the method to give back."""
    os.environ.setdefault(ENGINE_WORKER_START, os.environ.get(_VLLM_METHOD, "fork"))


def fork_engine_workers() -> None:
    """vLLM's general-plugin hook (every process vLLM starts): in a process a Generate
    replica's engine started, the replica's own start method again."""
    wanted = os.environ.get(ENGINE_WORKER_START)
    if wanted is None or _in_ray_worker():
        return
    os.environ[_VLLM_METHOD] = wanted


def _in_ray_worker() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())
