"""The Generate replica's engine forks its worker (``deployments/vllm_adapter/worker_fork.py``):
vLLM loads the plugin from the installed entry point, and in a process that a
replica's engine started, vLLM's own choice of start method is fork again."""

from __future__ import annotations

import os
import subprocess
import sys

from deployments.config.graph_config import REPO_ROOT
from deployments.vllm_adapter.worker_fork import ENGINE_WORKER_START

# What an EngineCore process runs before it starts its worker: vLLM's plugins, then
# vLLM's own choice of start method.
ENGINE_CORE = """
from vllm.plugins import load_general_plugins
from vllm.utils.system_utils import get_mp_context
load_general_plugins()
print(get_mp_context().get_start_method())
"""


def start_method(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_CORE],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


def test_an_engine_core_a_replica_started_forks_its_worker() -> None:
    # As the replica's EngineCore inherits it: vLLM's spawn, forced in the Ray actor.
    inherited = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    assert start_method({**inherited, ENGINE_WORKER_START: "fork"}) == "fork"
