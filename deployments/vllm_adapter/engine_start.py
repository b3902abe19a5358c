"""Starting a Generate replica's engine: an in-process ``AsyncLLM``, as ``vllm serve``
starts one, and the cores a CPU engine binds to."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# Host-wide: graphs, applications and the Ray nodes of a local cluster share its cores.
CLAIMS_DIR = Path(tempfile.gettempdir()) / "scaleout-serve-engine-cores"


async def start_vllm_engine(args: argparse.Namespace) -> Any:
    """Start an in-process ``AsyncLLM`` as ``vllm serve`` does."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from deployments.vllm_adapter.engine_load import KvCacheUse

    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return AsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=engine_args.enable_log_requests,
        disable_log_stats=engine_args.disable_log_stats,
        # The routers' KV cache reading; a custom logger would turn stats on where the
        # engine runs without them, so it rides only with them.
        stat_loggers=None if engine_args.disable_log_stats else [KvCacheUse],
    )


def engine_core_count(
    setting: int | Literal["auto", "off"], assigned_cpus: float | None
) -> int | None:
    """How many cores a CPU engine binds to (None: unbound): ``auto`` as many as Ray
    gives the replica threads (``OMP_NUM_THREADS``: its CPUs rounded down, at least 1)."""
    if setting == "off":
        return None
    if setting == "auto":
        return max(math.floor(assigned_cpus or 1), 1)
    return setting


@dataclass
class CoreClaim:
    """Cores a CPU engine binds to, held against the host's other engines until
    ``release`` or this process's exit (the kernel drops its locks)."""

    cores: list[int]
    locks: list[int] = field(default_factory=list, repr=False)
    """Open descriptors of the locked core files (none where it fell back to sharing)."""

    def release(self) -> None:
        for fd in self.locks:
            os.close(fd)
        self.locks.clear()


def claim_cores(
    allowed: list[int], cores: int, local_rank: int, claims: Path = CLAIMS_DIR
) -> CoreClaim:
    """The first ``cores`` of ``allowed`` that no other engine on this host holds
    (a lock on a file per core): so engines of several graphs, applications or local
    Ray nodes on one host bind apart. Where fewer are free, the rank's cores
    (``replica_cores``), shared with another engine."""
    ordered = sorted(allowed)
    wanted = min(cores, len(ordered))
    claim = CoreClaim([])
    with contextlib.suppress(OSError):  # no claims where the folder cannot be written
        claims.mkdir(exist_ok=True)
        for core in ordered:
            fd = os.open(claims / f"core-{core}", os.O_RDONLY | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            claim.cores.append(core)
            claim.locks.append(fd)
            if len(claim.cores) == wanted:
                return claim
    claim.release()
    return CoreClaim(replica_cores(ordered, cores, local_rank))


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
