"""The highest rate vLLM's own server, topology I and topology S each sustain.

    python -m bench.capacity --out docs/capacity.md

Each server serves the same seeded chat requests (the grid's shapes, length
scale as given), started as a user would: vLLM's coupled OpenAI server
(``python -m vllm.entrypoints.openai.api_server``, the engine and parser flags
of ``configs/I.yaml``), then ``serve run configs/I.yaml`` and
``configs/S.yaml``. First its idle TTFT: ``--idle-requests`` requests one at a
time, after a warm-up. Then open-loop Poisson cells at rising rates; a rate is
*sustained* when every request completes, the cell drains, and TTFT p95 stays
within ``--factor`` (2) × the idle p95. A rate that is not gets ``--retries``
more tries (a p95 over a few dozen requests on a shared 2-core host moves with
one stall); the ladder stops at the first rate no try sustained.
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
from .clients import CLIENTS, Client
from .shapes import BenchRequest, make_requests
from .stats import CellSummary, summarize
from .topology import CONFIGS, Overrides, running_topology

SERVERS = ("vllm", "I", "S")
WARM_UP = 8
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


def _client(name: str) -> Client:
    # vLLM's server ignores the placement header the I client sends.
    return CLIENTS["I" if name == "vllm" else name]


def _requests(args: argparse.Namespace, n: int, seed: int) -> list[BenchRequest]:
    return make_requests(
        args.shape, n, model=DEFAULT_MODEL, length_scale=args.length_scale, seed=seed
    )


async def measure(name: str, url: str, args: argparse.Namespace) -> list[Rung]:
    client = _client(name)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    rungs: list[Rung] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=None) as http:
        warm = _requests(args, WARM_UP, args.seed + 1)
        arrivals = [0.1 * i for i in range(WARM_UP)]
        await run_cell(http, client, warm, arrivals, drain_s=300, label=f"{name} warm-up")
        idle = _requests(args, args.idle_requests, args.seed)
        await wait_idle(http)
        records = []
        for request in idle:  # one at a time: nothing queues
            one = await run_cell(http, client, [request], [0.0], drain_s=300, label=f"{name} idle")
            records += one.records
        idle_summary = summarize(name, args.shape, 0.0, records, drained=True, wall_s=1, cpu_s={})
        rungs.append(Rung(name, 0.0, idle_summary.completed == len(idle), idle_summary))
        bound = (idle_summary.ttft_p95_ms or 0.0) * args.factor
        for rps in (float(r) for r in args.rates.split(",")):
            for attempt in range(1 + args.retries):
                rung = await _rung(http, name, rps, bound, args, seed=args.seed + attempt)
                rungs.append(rung)
                if rung.sustained:
                    break
            if not rung.sustained:
                break
    return rungs


async def _rung(
    http: httpx.AsyncClient, name: str, rps: float, bound_ms: float, args: argparse.Namespace,
    *, seed: int,
) -> Rung:  # fmt: skip
    """One open-loop cell at ``rps``: sustained if all complete within the TTFT bound."""
    arrivals = arrival_times([Phase(rps, args.duration)], poisson=True, seed=seed)
    batch = _requests(args, len(arrivals), seed)
    await wait_idle(http)
    result = await run_cell(
        http, _client(name), batch, arrivals, drain_s=args.drain, label=f"{name} @{rps:g} rps"
    )
    summary = summarize(
        name, args.shape, rps, result.records,
        drained=result.drained, wall_s=result.wall_s, cpu_s={},
    )  # fmt: skip
    p95 = summary.ttft_p95_ms
    ok = result.drained and summary.completed == summary.requests and p95 is not None
    return Rung(name, rps, ok and p95 is not None and p95 <= bound_ms, summary)


def highest(rungs: list[Rung]) -> float:
    """The highest rate sustained before the first rate no try sustained."""
    tries: dict[float, bool] = {}
    for rung in rungs[1:]:
        tries[rung.rps] = tries.get(rung.rps, False) or rung.sustained
    best = 0.0
    for rps, sustained in tries.items():
        if not sustained:
            break
        best = rps
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
        f"{args.idle_requests} requests one at a time, after {WARM_UP} warm-up requests. "
        f"A rate is sustained when every request completes and TTFT p95 ≤ "
        f"{args.factor:g} × the idle p95; a rate that is not gets {args.retries} more "
        "try(s) with other seeds, and the ladder stops at the first rate no try "
        "sustained. TTFT is measured by the client from sending the request to the "
        "first chunk that carries output.",
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
    parser.add_argument("--rates", default="1,2,3,4,5,6,8,10,12", help="rps ladder, rising")
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--drain", type=float, default=60)
    parser.add_argument("--idle-requests", type=int, default=30)
    parser.add_argument("--retries", type=int, default=1, help="more tries of a failed rate")
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
