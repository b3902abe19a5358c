"""What one ``bench.routing`` run measured: each conversation turn, per run and workload."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.stats import percentile


@dataclass
class Turn:
    conversation: int
    turn: int
    sent_s: float
    ttft_ms: float | None = None
    replica: str | None = None
    error: str | None = None


@dataclass
class Result:
    run: str
    workload: str
    turns: list[Turn] = field(default_factory=list)
    hits: float = 0.0
    queries: float = 0.0
    wall_s: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None

    def ttft(self, q: float) -> float | None:
        return percentile([t.ttft_ms for t in self.turns if t.ttft_ms is not None], q)

    def per_replica(self) -> list[int]:
        return sorted(Counter(t.replica for t in self.turns if t.replica).values(), reverse=True)

    def stayed(self) -> float | None:
        """Share of later turns served where the conversation's first turn was."""
        first = {t.conversation: t.replica for t in self.turns if t.turn == 0}
        later = [t for t in self.turns if t.turn > 0 and t.replica]
        if not later:
            return None
        return sum(t.replica == first.get(t.conversation) for t in later) / len(later)
