"""What one ``bench.multinode`` run measured: the ramp's timeline and the soak."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CPU_GROUP = "cpu-text"


@dataclass
class RampResult:
    ramp: str
    samples: list[dict[str, Any]]
    sent_s: list[float]
    outcomes: dict[str, int]
    load_end_s: float


@dataclass
class SoakResult:
    minutes: float
    rps: float
    kinds: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """replica (deployment/id) → (minute, RSS MiB) samples."""
    engine_requests: list[tuple[float, float]] = field(default_factory=list)
    engine_requests_after_s: float | None = None
    """Seconds after the last request ended until the engines held none (None: never)."""
