"""Figures of ``bench.requests`` cells: rates, CPU, latency percentiles, spreads."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bench.requests.processes import ENGINE

if TYPE_CHECKING:
    from bench.requests.study import Cell, ServerRun


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rps(cell: Cell) -> float:
    return cell.requests / cell.wall_s


def cpu_ms(cell: Cell, *, engine: bool = True) -> float:
    spent = sum(v for k, v in cell.cpu_s.items() if engine or k != ENGINE)
    return spent / cell.requests * 1000


def ttft_p50(cell: Cell) -> float:
    return percentile(cell.ttft_ms, 0.5)


def ttft_p95(cell: Cell) -> float:
    return percentile(cell.ttft_ms, 0.95)


def e2e_p50(cell: Cell) -> float:
    return percentile(cell.e2e_ms, 0.5)


def spread(values: Sequence[float], fmt: str = ".0f") -> str:
    """The median, and min–max when there is more than one value."""
    mid = format(statistics.median(values), fmt)
    if len(values) == 1:
        return mid
    return f"{mid} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def rounds(run: ServerRun, mode: str, concurrency: int) -> list[Cell]:
    return [c for c in run.cells if c.mode == mode and c.concurrency == concurrency]


def modes(run: ServerRun) -> list[str]:
    return list(dict.fromkeys(c.mode for c in run.cells))


def concurrencies(runs: Sequence[ServerRun]) -> list[int]:
    return sorted({c.concurrency for r in runs for c in r.cells})
