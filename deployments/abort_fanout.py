"""Abort fan-out: the control plane that reaches every replica of the data plane.

A request can be on any Generate replica, and a stateful text stream on any
Derender replica, so ``/inference/v1/abort_requests`` is broadcast (Ray's
``DeploymentHandle.broadcast``) to all of them. The engine that holds a
request aborts it, and its stream ends with ``finish_reason: "abort"``
through whichever placement carries it. Unknown or finished ids are a no-op.

The same fan-out reads each engine's state for ``/metrics``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from .protocol import EngineState

BROADCAST_TIMEOUT_S = 10.0


@serve.deployment(
    name="AbortFanout",
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=64,
)
class AbortFanout:
    def __init__(self, generate: DeploymentHandle, derender: DeploymentHandle) -> None:
        self._generate = generate
        self._derender = derender

    async def abort(self, request_ids: list[str]) -> dict[str, int]:
        """Abort on every Generate replica; count the streams each tier held."""
        # Side by side: an aborted stream leaves its Derender replica within
        # milliseconds, so asking afterwards would find nothing held.
        aborted, held = await asyncio.gather(
            self._generate.broadcast("abort", request_ids).results_async(
                timeout_s=BROADCAST_TIMEOUT_S, return_exceptions=True
            ),
            self._derender.broadcast("holds", request_ids).results_async(
                timeout_s=BROADCAST_TIMEOUT_S, return_exceptions=True
            ),
        )
        return {"generate": sum(_ints(aborted)), "derender": sum(_ints(held))}

    async def engine_states(self) -> list[EngineState]:
        """Every Generate replica's engine state (``/metrics``)."""
        states = await self._generate.broadcast("engine_state").results_async(
            timeout_s=BROADCAST_TIMEOUT_S, return_exceptions=True
        )
        return [s for s in states if isinstance(s, EngineState)]

    async def ready(self) -> bool:
        return True


def _ints(results: list[Any]) -> list[int]:
    """Replica results that came back (a replica that died mid-call is skipped)."""
    return [r for r in results if isinstance(r, int)]
