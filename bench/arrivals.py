"""Open-loop arrival times: seeded Poisson or constant, one rate or a ramp.

Requests are issued at these times whatever the completions do, as in the
seed's rate-driven load.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    """``rps`` requests per second for ``seconds``."""

    rps: float
    seconds: float


def arrival_times(phases: list[Phase], *, poisson: bool, seed: int) -> list[float]:
    """Seconds from the start at which each request is issued."""
    rng = random.Random(seed)
    times: list[float] = []
    start = 0.0
    for phase in phases:
        end = start + phase.seconds
        if phase.rps > 0:
            t = start
            while True:
                t += rng.expovariate(phase.rps) if poisson else 1 / phase.rps
                if t >= end:
                    break
                times.append(t)
        start = end
    return times


def parse_ramp(spec: str) -> list[Phase]:
    """``"0.5:30,2:60,0.5:30"`` → phases of (rps, seconds)."""
    phases = []
    for part in spec.split(","):
        rps, seconds = part.split(":")
        phases.append(Phase(float(rps), float(seconds)))
    return phases
