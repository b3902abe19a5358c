"""The grid: topologies one after another, each serving every (shape, rps) cell.

Each topology starts from its ``configs/`` file (or the grid runs against one
graph already up, ``--url``). Every topology sees the same seeded requests at
the same seeded arrival times, so the columns differ only in the topology.
Results land in ``out``: ``requests.jsonl``, ``cells.json``, ``timeline.json``
and the report (``report.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.arrivals import Phase, arrival_times
from bench.cells import run_cell, wait_engines_idle
from bench.clients import CLIENTS
from bench.observe import Observer, cpu_between
from bench.shapes import make_requests
from bench.stats import CellSummary, summarize
from bench.topology import Overrides, app_name, running_topology

WARMUP_REQUESTS = 2


@dataclass
class GridSpec:
    topologies: list[str]
    shapes: list[str]
    rps: list[float]
    """Rates as run, after ``rate_scale``."""
    duration_s: float
    drain_s: float
    length_scale: float
    rate_scale: float
    poisson: bool
    seed: int
    model: str
    profile: str = "local"
    """``local`` or ``gpu``: which configs start each topology (``topology.py``)."""
    url: str | None = None
    """Run every topology's client against this graph instead of starting configs."""
    kv_cache_gib: float | None = None
    set_args: dict[str, str] = field(default_factory=dict)
    """Graph args set over each topology's config (``--set key=value``)."""
    ramp: list[Phase] = field(default_factory=list)
    """If set, each cell follows these phases (``rps`` then names the peak)."""


@contextlib.contextmanager
def graph_for(spec: GridSpec, topology: str, out: Path) -> Iterator[tuple[str, str]]:
    """(base URL, Serve app name) of a graph serving ``topology``."""
    if spec.url is not None:
        yield spec.url, "default"
        return
    overrides = Overrides(spec.profile, spec.kv_cache_gib, spec.set_args)
    with running_topology(topology, out / "serve", overrides) as url:
        yield url, app_name(topology)


def cell_phases(spec: GridSpec, rps: float) -> list[Phase]:
    return spec.ramp or [Phase(rps, spec.duration_s)]


async def run_topology(
    spec: GridSpec, topology: str, url: str, app: str, out: Path
) -> list[CellSummary]:
    client = CLIENTS[topology]
    observer = Observer(port=httpx.URL(url).port or 80, app=app)
    watcher = asyncio.create_task(observer.run())
    summaries = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(None, connect=30)
    try:
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
            for shape in spec.shapes:
                warmup = make_requests(
                    shape, WARMUP_REQUESTS, model=spec.model, length_scale=spec.length_scale,
                    seed=spec.seed + 1,
                )  # fmt: skip
                await run_cell(http, client, warmup, [0.0] * len(warmup), drain_s=300,
                               label=f"{topology} {shape} warm-up")  # fmt: skip
                for rps in spec.rps:
                    phases = cell_phases(spec, rps)
                    arrivals = arrival_times(phases, poisson=spec.poisson, seed=spec.seed)
                    requests = make_requests(
                        shape, len(arrivals), model=spec.model,
                        length_scale=spec.length_scale, seed=spec.seed,
                    )  # fmt: skip
                    await wait_engines_idle(http)
                    first = observer.now()
                    result = await run_cell(
                        http, client, requests, arrivals, drain_s=spec.drain_s,
                        label=f"{topology} {shape} @{rps:g} rps",
                        duration_s=sum(p.seconds for p in phases) if spec.ramp else 0.0,
                    )  # fmt: skip
                    last = observer.now()
                    cpu = cpu_between(first, last, observer.samples)
                    summary = summarize(
                        topology, shape, rps, result.records,
                        drained=result.drained, wall_s=result.wall_s, cpu_s=cpu,
                    )  # fmt: skip
                    summaries.append(summary)
                    cell = {"topology": topology, "shape": shape, "rps": rps}
                    with (out / "requests.jsonl").open("a") as f:
                        for record in result.records:
                            f.write(json.dumps({**cell, **record.row()}) + "\n")
                    _append_json(out / "timeline.json", {
                        **cell,
                        "start_s": round(first.t_s, 2),
                        "end_s": round(last.t_s, 2),
                    }, key="cells")  # fmt: skip
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    _append_json(out / "timeline.json", {topology: observer.timeline()}, key="samples")
    return summaries


def run_grid(spec: GridSpec, out: Path) -> list[CellSummary]:
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("requests.jsonl", "timeline.json", "cells.json"):
        (out / stale).unlink(missing_ok=True)
    host = {"machine": platform.machine(), "cpus": os.cpu_count(), "system": platform.system()}
    (out / "spec.json").write_text(json.dumps({**asdict(spec), "host": host}, indent=2) + "\n")
    summaries: list[CellSummary] = []
    for topology in spec.topologies:
        with graph_for(spec, topology, out) as (url, app):
            summaries += asyncio.run(run_topology(spec, topology, url, app, out))
        (out / "cells.json").write_text(json.dumps([asdict(s) for s in summaries], indent=2) + "\n")
    return summaries


def _append_json(path: Path, item: dict[str, Any], *, key: str) -> None:
    data: dict[str, list[Any]] = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault(key, []).append(item)
    path.write_text(json.dumps(data) + "\n")
