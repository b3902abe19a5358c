"""Starting a Generate replica's engine: an in-process ``AsyncLLM``, as ``vllm serve``
starts one, and the cores a CPU engine binds to."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any


async def start_vllm_engine(args: argparse.Namespace) -> Any:
    """Start an in-process ``AsyncLLM`` as ``vllm serve`` does."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return AsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=engine_args.enable_log_requests,
        disable_log_stats=engine_args.disable_log_stats,
    )


def replica_cores(allowed: list[int], cores: int, local_rank: int) -> list[int]:
    """The cores of a node's ``local_rank``-th CPU engine when each gets ``cores``.

    Replicas past what the node holds wrap around and share, as two engines
    without binding would; vLLM then binds one OpenMP thread per core.
    """
    ordered = sorted(allowed)
    cores = min(cores, len(ordered))
    start = (local_rank * cores) % len(ordered)
    return [ordered[(start + i) % len(ordered)] for i in range(cores)]


@contextlib.contextmanager
def started_on(cores: list[int] | None) -> Iterator[None]:
    """The engine processes started inside run on ``cores`` only (None: where the
    replica runs).

    ``VLLM_CPU_OMP_THREADS_BIND`` binds the worker's threads, not the EngineCore
    process, which then runs on any core; and both wait for each other in vLLM's
    spin loop (``shm_broadcast.SpinCondition``: ``sched_yield`` for a second after
    each read), so after every request the two keep both cores of a 2-core host
    busy for a second, and a request arriving then waited behind them at each hop
    (docs/benchmarks.md, "The engine's spin-wait and the hops").

    A process starts with its parent thread's affinity, and vLLM starts the
    EngineCore from this thread (the worker from the EngineCore), so this thread
    takes ``cores`` while the engine starts. After, every thread of the replica
    gets the replica's cores back, those the engine client started meanwhile
    (zmq's) too.
    """
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        for thread in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(thread), before)
