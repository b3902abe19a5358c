"""Per-request timings and per-cell summaries (the seed's TTFT/TPOT definitions)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """One request as its client saw it; times in seconds from the cell start."""

    index: int
    scheduled_s: float
    sent_s: float | None = None
    delta_s: list[float] = field(default_factory=list)
    """When each chunk carrying output arrived."""
    done_s: float | None = None
    first_chunk_s: float | None = None
    """When the first chunk of any kind arrived (vLLM's benchmark times TTFT to it)."""
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_s is not None

    def ttft_ms(self) -> float | None:
        if not self.ok or not self.delta_s or self.sent_s is None:
            return None
        return (self.delta_s[0] - self.sent_s) * 1000

    def first_chunk_ms(self) -> float | None:
        if not self.ok or self.first_chunk_s is None or self.sent_s is None:
            return None
        return (self.first_chunk_s - self.sent_s) * 1000

    def tpot_ms(self) -> float | None:
        return tpot_ms(self.delta_s, self.output_tokens) if self.ok else None

    def e2e_ms(self) -> float | None:
        if not self.ok or self.sent_s is None or self.done_s is None:
            return None
        return (self.done_s - self.sent_s) * 1000

    def row(self) -> dict[str, Any]:
        """The JSONL row: raw times (first and last delta only) and the derived metrics."""
        data = asdict(self)
        deltas = data.pop("delta_s")
        data.update(
            first_delta_s=deltas[0] if deltas else None,
            last_delta_s=deltas[-1] if deltas else None,
            deltas=len(deltas),
            ttft_ms=self.ttft_ms(),
            tpot_ms=self.tpot_ms(),
            e2e_ms=self.e2e_ms(),
        )
        return data


def tpot_ms(delta_s: list[float], output_tokens: int) -> float | None:
    """(last delta − first delta) / (output_tokens − 1), in ms.

    Robust to chunk coalescing: it does not count chunks, only the time the
    tokens took after the first one.
    """
    if output_tokens < 2 or len(delta_s) < 1:
        return None
    return (delta_s[-1] - delta_s[0]) / (output_tokens - 1) * 1000


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class CellSummary:
    """One (topology, shape, rps) cell."""

    topology: str
    shape: str
    rps: float
    requests: int
    completed: int
    errors: int
    drained: bool
    wall_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    e2e_p50_ms: float | None
    e2e_p95_ms: float | None
    output_tokens_per_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds each tier's processes spent during the cell."""


def summarize(
    topology: str,
    shape: str,
    rps: float,
    records: list[RequestRecord],
    *,
    drained: bool,
    wall_s: float,
    cpu_s: dict[str, float],
) -> CellSummary:
    ok = [r for r in records if r.ok]
    ttft = [v for r in ok if (v := r.ttft_ms()) is not None]
    tpot = [v for r in ok if (v := r.tpot_ms()) is not None]
    e2e = [v for r in ok if (v := r.e2e_ms()) is not None]
    return CellSummary(
        topology=topology,
        shape=shape,
        rps=rps,
        requests=len(records),
        completed=len(ok),
        errors=sum(1 for r in records if r.error is not None),
        drained=drained,
        wall_s=wall_s,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p95_ms=percentile(ttft, 95),
        tpot_p50_ms=percentile(tpot, 50),
        tpot_p95_ms=percentile(tpot, 95),
        e2e_p50_ms=percentile(e2e, 50),
        e2e_p95_ms=percentile(e2e, 95),
        output_tokens_per_s=sum(r.output_tokens for r in ok) / wall_s if wall_s > 0 else 0.0,
        cpu_s=cpu_s,
    )
