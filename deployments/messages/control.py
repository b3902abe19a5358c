"""Wire models of the control plane (``ControlPlane``) and each replica's control channel.

Apart from ``messages/tier.py`` because they need nothing of vLLM: the ControlPlane
replica imports only this, and stays a small process (importing vLLM costs a
replica ~9 s of CPU and ~700 MB at start).
"""

from __future__ import annotations

from typing import Literal

from prometheus_client.metrics_core import Metric
from pydantic import BaseModel, ConfigDict


class EngineState(BaseModel):
    """What one Generate replica's engine reports to ``/metrics``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    replica: str
    """The Serve replica id; ``/metrics`` labels this engine's series with it."""
    unfinished_requests: int
    """Requests the engine holds right now, running or queued (not as of its last step)."""
    vllm_metrics: list[Metric]
    """The engine's own vLLM metric families (its Prometheus stat logger)."""


CommandKind = Literal["subscribed", "abort", "abort_calls", "engine_state", "host_load"]
Tier = Literal["generate", "derender"]
"""The data-plane tiers that subscribe to the control plane."""


class HostLoad(BaseModel):
    """How busy one replica's host and event loop were (``scaling/host_load.py``)."""

    tier: Tier
    replica: str
    host: str
    """The machine (its kernel's boot id): replicas with the same one share its CPUs."""
    cpus: list[int]
    """The CPUs the replica may run on (its affinity)."""
    host_busy: float
    """Share of those CPUs busy, every process counted, 0–1."""
    loop_busy: float
    """Share of wall time the replica's event-loop thread ran or waited to run, 0–1."""


class ControlCommand(BaseModel):
    """One control-plane command, sent down a replica's subscription (``control_channel``)."""

    id: int
    """Answered with ``ControlPlane.reply(id, result)``; 0 for ``subscribed`` (no answer)."""
    kind: CommandKind
    """``subscribed``: the channel is open. ``abort``: abort ``request_ids`` here, answer how
    many this replica held. ``abort_calls``: end the bound Generate calls whose step-channel
    keys are ``request_ids``, answer how many were there (Generate only). ``engine_state``:
    answer an :class:`EngineState` (Generate only). ``host_load``: answer a
    :class:`HostLoad`, or None before a first window."""
    request_ids: list[str] = []
    """For ``abort``: the ids clients hold; for ``abort_calls``: step-channel keys."""
