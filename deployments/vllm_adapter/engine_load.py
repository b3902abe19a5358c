"""How full the engine's KV cache is, as its scheduler last reported: for the routers.

vLLM hands every stat logger the scheduler's stats after each engine step
(``StatLoggerBase``, the interface vLLM offers for custom loggers; the same numbers
its Prometheus logger writes as ``vllm:kv_cache_usage_perc``). This one keeps the
latest KV cache use, which a Generate replica reports to the routers with its block
set (``Generate.record_routing_stats``): Generate's router sends a prompt that no
replica holds to the replica with the shortest queue, then the emptiest KV cache
(``routing/prefix_router.py``), as llm-d's scheduler scores KV-cache utilisation.

A replica runs one engine, so the reading is the process's.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase


class KvCacheUse(StatLoggerBase):
    """A per-engine stat logger (vLLM builds one per engine from the class)."""

    latest: float | None = None
    """The fraction of KV cache blocks in use at the engine's last step; None before
    its first (or where vLLM runs without stats)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        KvCacheUse.latest = None

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            KvCacheUse.latest = float(scheduler_stats.kv_cache_usage)

    def log_engine_initialized(self) -> None:
        pass


def kv_cache_use() -> float | None:
    return KvCacheUse.latest
