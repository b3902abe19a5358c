"""``GraphConfig.observability``: what the graph records of its own work
(``deployments/observability/``, docs/observability.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ObservabilityConfig(BaseModel):
    """The graph's own metrics, beside each engine's vLLM metrics (always on), its
    traces, and Serve's access log lines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: bool = Field(
        True,
        description="Every replica records the graph's per-hop metrics (ray_scaleout_*, "
        "exported through Ray's metrics agents and merged into /metrics). Off: none is "
        "recorded, and /metrics has the engines' vLLM metrics only.",
    )
    otlp_traces_endpoint: str | None = Field(
        None,
        description="An OpenTelemetry collector every replica sends its spans to (as "
        "vLLM's --otlp-traces-endpoint; gRPC, or HTTP with "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf), the engines' own spans "
        "included: one trace per request across the tiers. None (the default): no "
        "span is made.",
    )
    access_log: Literal["ingress", "all"] = Field(
        "ingress",
        description="Serve's access log lines. 'ingress' (the default): one per HTTP "
        "request, written by the Ingress, as vLLM's server logs each request. 'all': also "
        "one per call into Render, Generate and Derender, each naming the request's id, "
        "so that a request can be followed through every tier's log, at two to three "
        "more lines per request for Ray's log monitor to forward (docs/benchmarks.md).",
    )
