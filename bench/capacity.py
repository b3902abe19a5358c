"""The highest rate vLLM's own server, topology I and topology S each sustain.

    python -m bench.capacity --out docs/capacity.md

Each server serves the same seeded chat requests (the grid's shapes, length
scale as given), started as a user would: vLLM's coupled OpenAI server
(``python -m vllm.entrypoints.openai.api_server``, the engine and parser flags
of ``configs/I.yaml``), then ``serve run configs/I.yaml`` and
``configs/S.yaml``. First its idle TTFT: ``--idle-requests`` requests one at a
time. Then open-loop Poisson cells at rising rates; a rate is *sustained* when
every request completes, the cell drains, and TTFT p95 stays within
``--factor`` (2) × the idle p95. The ladder stops at the first rate that is not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from deployments.topologies import app_config
from tests.support.servers import REPO, free_port, running

from .__main__ import DEFAULT_MODEL
from .arrivals import Phase, arrival_times
from .cells import run_cell
from .clients import CLIENTS
from .shapes import BenchRequest, make_requests
from .stats import CellSummary, summarize
from .topology import CONFIGS, Overrides, running_topology

SERVERS = ("vllm", "I", "S")
# Requests the engine runs or queues, from a /metrics exposition: the graph's
# gauge per engine, or vLLM's own gauges.
BUSY = re.compile(
    r"^(?:scaleout_engine_unfinished_requests|vllm:num_requests_(?:running|waiting))"
    r"(?:\{[^}]*\})? (?P<value>\S+)$"
)


@dataclass
class Rung:
    server: str
    rps: float
    sustained: bool
    summary: CellSummary


@contextlib.contextmanager
def vllm_server(work: Path) -> Iterator[str]:
    """vLLM's coupled server with topology I's engine and parser flags."""
    args = app_config(CONFIGS / "I.yaml")["args"]
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", DEFAULT_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(args["max_model_len"]),
        "--enable-auto-tool-choice", "--tool-call-parser", args["tool_call_parser"],
        "--reasoning-parser", args["reasoning_parser"],
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(args["kv_cache_gib"]),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PYTHONPATH": str(REPO),
    }
    with running(argv, port=port, log_path=work / "vllm.log", env=env) as server:
        yield server.base_url


@contextlib.contextmanager
def server_for(name: str, work: Path) -> Iterator[str]:
    if name == "vllm":
        with vllm_server(work) as url:
            yield url
    else:
        with running_topology(name, work / "serve", Overrides()) as url:
            yield url


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 120) -> None:
    """Until the engines hold no request (a cell starts on an idle server)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (await http.get("/metrics")).text
        values = [float(m["value"]) for m in map(BUSY.match, text.splitlines()) if m]
        if values and not any(values):
            return
        await asyncio.sleep(0.5)


async def measure(name: str, url: str, args: argparse.Namespace) -> list[Rung]:
    # vLLM's server ignores the placement header the I client sends.
    client = CLIENTS["I" if name == "vllm" else name]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    rungs: list[Rung] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=None) as http:

        def requests(n: int, seed: int) -> list[BenchRequest]:
            return make_requests(
                args.shape, n, model=DEFAULT_MODEL, length_scale=args.length_scale, seed=seed
            )

        warm = requests(2, args.seed + 1)
        await run_cell(http, client, warm, [0.0, 0.0], drain_s=300, label=f"{name} warm-up")
        idle = requests(args.idle_requests, args.seed)
        await wait_idle(http)
        records = []
        for request in idle:  # one at a time: nothing queues
            one = await run_cell(http, client, [request], [0.0], drain_s=300, label=f"{name} idle")
            records += one.records
        idle_summary = summarize(name, args.shape, 0.0, records, drained=True, wall_s=1, cpu_s={})
        rungs.append(Rung(name, 0.0, idle_summary.completed == len(idle), idle_summary))
        bound = (idle_summary.ttft_p95_ms or 0.0) * args.factor
        for rps in (float(r) for r in args.rates.split(",")):
            arrivals = arrival_times([Phase(rps, args.duration)], poisson=True, seed=args.seed)
            batch = requests(len(arrivals), args.seed)
            await wait_idle(http)
            result = await run_cell(
                http, client, batch, arrivals, drain_s=args.drain, label=f"{name} @{rps:g} rps"
            )
            summary = summarize(
                name, args.shape, rps, result.records,
                drained=result.drained, wall_s=result.wall_s, cpu_s={},
            )  # fmt: skip
            p95 = summary.ttft_p95_ms
            ok = (
                result.drained
                and summary.completed == summary.requests
                and p95 is not None
                and p95 <= bound
            )
            rungs.append(Rung(name, rps, ok, summary))
            if not ok:
                break
    return rungs


def highest(rungs: list[Rung]) -> float:
    """The highest rate sustained before the first rate that was not."""
    best = 0.0
    for rung in rungs[1:]:
        if not rung.sustained:
            break
        best = rung.rps
    return best


def report(args: argparse.Namespace, results: dict[str, list[Rung]]) -> str:
    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value:.0f}"

    lines = [
        "# Highest sustained rate: vLLM's server, I and S",
        "",
        f"`{' '.join(['python -m bench.capacity', *sys.argv[1:]])}`",
        "",
        f"Host: {platform.machine()}, {psutil.cpu_count()} CPUs. Shape {args.shape}, length "
        f"scale {args.length_scale:g}, {args.duration:g} s of Poisson arrivals per rate "
        f"(seed {args.seed}), drain budget {args.drain:g} s. *Idle*: "
        f"{args.idle_requests} requests one at a time. A rate is sustained when every "
        f"request completes and TTFT p95 ≤ {args.factor:g} × the idle p95; the ladder "
        "stops at the first rate that is not. TTFT is measured by the client from sending "
        "the request to the first chunk that carries output.",
        "",
        "| server | rps | requests | completed | TTFT p50 ms | TTFT p95 ms | "
        "TPOT p50 ms | sustained |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rungs in results.items():
        for r in rungs:
            s = r.summary
            lines.append(
                f"| {name} | {'idle' if r.rps == 0 else f'{r.rps:g}'} | {s.requests} | "
                f"{s.completed} | {ms(s.ttft_p50_ms)} | {ms(s.ttft_p95_ms)} | "
                f"{'–' if s.tpot_p50_ms is None else f'{s.tpot_p50_ms:.2f}'} | "
                f"{'yes' if r.sustained else 'no'} |"
            )
    lines += ["", "| server | highest sustained rps | ÷ vLLM's |", "|---|---|---|"]
    reference = highest(results["vllm"]) if "vllm" in results else 0.0
    for name, rungs in results.items():
        best = highest(rungs)
        ratio = f"{best / reference:.2f}×" if reference else "–"
        lines.append(f"| {name} | {best:g} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--shape", default="chat")
    parser.add_argument("--length-scale", type=float, default=0.25)
    parser.add_argument("--rates", default="1,2,3,4,6,8,12,16", help="rps ladder, rising")
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--drain", type=float, default=60)
    parser.add_argument("--idle-requests", type=int, default=10)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, list[Rung]] = {}
    work = Path(f"/tmp/capacity-{time.time_ns()}")
    for name in args.servers.split(","):
        (work / name).mkdir(parents=True)
        with server_for(name, work / name) as url:
            results[name] = asyncio.run(measure(name, url, args))
        print(json.dumps([asdict(r) for r in results[name]], default=str)[:2000], flush=True)
    text = report(args, results)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
