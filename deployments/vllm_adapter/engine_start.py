"""Starting a Generate replica's engine: an in-process ``AsyncLLM``, as ``vllm serve``
starts one, and the cores a CPU engine binds to."""

from __future__ import annotations

import argparse
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
