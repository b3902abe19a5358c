"""Inside the engine: what vLLM's own metrics say a cell's requests did there.

A server's ``/metrics`` (vLLM's, or the graph's, which writes every Generate
replica's vLLM families with a ``replica`` label) is read before and after a
cell; the difference of a few of vLLM's counters and histograms says how long
each request spent in its engine (vLLM times it from the engine client taking
the request to its end) and how many tokens each engine step made. With the
client's own figures, Little's law gives how many of the cell's requests were
in an engine at a time: the rest were on their way in or out. At a fixed
concurrency, a server that holds its requests outside the engine longer runs
the engine on smaller batches, and at lower request rates.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.requests.figures import concurrencies, modes, rounds, rps, spread

if TYPE_CHECKING:
    from bench.requests.study import ServerRun

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
STEP_TOKENS = "vllm:iteration_tokens_total"
FAMILIES = (TTFT, E2E, STEP_TOKENS)
_WANTED = {f"{family}{suffix}" for family in FAMILIES for suffix in ("_sum", "_count")}


def totals(exposition: str) -> dict[str, float]:
    """Each wanted histogram's ``_sum`` and ``_count``, summed over its labels (every
    engine of the server)."""
    out = dict.fromkeys(sorted(_WANTED), 0.0)
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in _WANTED:
                out[sample.name] += sample.value
    return out


def read_totals(base_url: str, timeout_s: float = 30) -> dict[str, float]:
    """The server's totals now; empty if it serves no vLLM metrics (Serve's floor)."""
    try:
        reply = httpx.get(f"{base_url}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return {}
    if reply.status_code != 200 or E2E not in reply.text:
        return {}
    return totals(reply.text)


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What the cell added; empty when either reading is."""
    if not before or not after:
        return {}
    return {name: after[name] - before[name] for name in after}


def mean_ms(engine: Mapping[str, float], family: str) -> float | None:
    """A histogram's mean over the cell, in ms (None without observations)."""
    count = engine.get(f"{family}_count", 0.0)
    return 1000 * engine[f"{family}_sum"] / count if count else None


def tokens_per_step(engine: Mapping[str, float]) -> float | None:
    """Tokens (prompt and output) each engine step made, on average."""
    steps = engine.get(f"{STEP_TOKENS}_count", 0.0)
    return engine[f"{STEP_TOKENS}_sum"] / steps if steps else None


def steps_per_s(engine: Mapping[str, float], wall_s: float) -> float | None:
    steps = engine.get(f"{STEP_TOKENS}_count", 0.0)
    return steps / wall_s if steps and wall_s > 0 else None


def in_engine(engine: Mapping[str, float], requests_per_s: float) -> float | None:
    """Requests in an engine at a time, on average (Little's law: rate × time there)."""
    e2e = mean_ms(engine, E2E)
    return None if e2e is None else requests_per_s * e2e / 1000


def _figure(values: Sequence[float | None], fmt: str) -> str:
    known = [v for v in values if v is not None]
    return spread(known, fmt) if known else "–"


def engine_table(runs: Sequence[ServerRun]) -> list[str]:
    """The report's table: per cell, what vLLM's metrics say about the engine,
    beside the client's means (median over rounds, with their spread)."""
    lines = [
        "| server | text | concurrency | requests in an engine (of the concurrency) "
        "| e2e ms in the engine | e2e ms at the client | TTFT ms in the engine "
        "| TTFT ms at the client | engine steps/s | tokens per step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    in_engine_ms = partial(mean_ms, family=E2E)
    to_first_ms = partial(mean_ms, family=TTFT)
    for run in runs:
        for concurrency in concurrencies(runs):
            for mode in modes(run):
                cells = [c for c in rounds(run, mode, concurrency) if c.engine]
                if not cells:
                    continue
                figures = [
                    _figure([in_engine(c.engine, rps(c)) for c in cells], ".1f"),
                    _figure([in_engine_ms(c.engine) for c in cells], ".0f"),
                    spread([statistics.fmean(c.e2e_ms) for c in cells]),
                    _figure([to_first_ms(c.engine) for c in cells], ".0f"),
                    spread([statistics.fmean(c.ttft_ms) for c in cells]),
                    _figure([steps_per_s(c.engine, c.wall_s) for c in cells], ".0f"),
                    _figure([tokens_per_step(c.engine) for c in cells], ".1f"),
                ]
                text = "–" if mode == "vllm" else mode
                lines.append(f"| {run.label} | {text} | {concurrency} | {' | '.join(figures)} |")
    return lines if len(lines) > 2 else []
