"""A benchmark's graph variants on the command line: ``NAME:K=V,...``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# A variant's value that names the run's trace collector (``otlp_collector``).
OTLP_ENDPOINT = "{otlp}"


def variant_pairs(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """``K=V,...`` as (environment variables, graph args): an upper-case key is a
    variable (``RAY_…``), a lower-case one a ``GraphConfig`` key (dotted keys nest)."""
    pairs = dict(pair.split("=", 1) for pair in text.split(",") if pair)
    env = {k: v for k, v in pairs.items() if k[:1].isupper()}
    return env, {k: v for k, v in pairs.items() if k not in env}


@dataclass
class Traced:
    """A run's variants, and what its trace collector was sent (None: none ran)."""

    variants: list[str]
    spans: int | None = None

    def note(self) -> list[str]:
        """The report's line on it."""
        if self.spans is None:
            return []
        return [
            f"Traced variants sent their spans to a collector in its own process "
            f"(`bench/harness/otlp_collector.py`): {self.spans} spans received.",
            "",
        ]


@contextmanager
def with_collector(variants: list[str]) -> Iterator[Traced]:
    """``variants`` with ``{otlp}`` as the endpoint of a trace collector started, in a
    process of its own, for the run when one asks for it (e.g.
    ``traced:observability.otlp_traces_endpoint={otlp}``); after the run, how many
    spans it was sent (a traced graph that sent none measured nothing)."""
    if not any(OTLP_ENDPOINT in v for v in variants):
        yield Traced(variants)
        return
    collector = subprocess.Popen(
        [sys.executable, "-m", "bench.harness.otlp_collector"], stdout=subprocess.PIPE, text=True
    )
    assert collector.stdout is not None
    endpoint = collector.stdout.readline().strip()
    traced = Traced([v.replace(OTLP_ENDPOINT, endpoint) for v in variants])
    try:
        yield traced
    finally:
        collector.terminate()
        traced.spans = int(collector.stdout.read().strip() or 0)
        collector.wait()
