"""Derender scaled on ongoing requests against Derender scaled on its CPU, on two loads
where streams per replica mislead.

    python -m bench.scaling --out docs/autoscaling-signals.md

One graph per signal (``serve run``, tier text, the reasoning and tool parsers,
Derender with ``configs/S.yaml``'s ``num_cpus``), each taking the same phases in
turn, closed loop:

- ``slow``: many streams whose engine steps are held (``bench/harness/paced_decode.py``,
  a GPU-like pace that costs no CPU): many streams, little text work;
- ``fast``: a few unpaced streams: few streams, the Derender replica's CPU busy;
- an idle phase after each, to see the tier scale in.

Every second: the Derender replica processes and the cores each used. Per request:
when it started, its TPOT (first to last output chunk over its output tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import json
import os
import platform
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop

from bench.harness.servers import TINY_MODEL, long_chat, running_graph
from bench.harness.timed_stream import timed_chat
from bench.observe import sample

DERENDER_NUM_CPUS = 0.25  # configs/S.yaml
SCALING = {
    "min_replicas": 1,
    "max_replicas": 4,
    "upscale_delay_s": 2,
    "downscale_delay_s": 10,
    "look_back_period_s": 15,
}
SIGNALS: dict[str, dict[str, Any]] = {
    # Derender's own default target (deployments/declarations/derender.py).
    "ongoing_requests": {"policy": "ongoing_requests", "target_ongoing_requests": 8},
    "cpu": {"policy": "cpu", "target_cpu_utilization": 0.7},
}
PROMPT = "think: what is 2 plus 3? explain each step"


@dataclass(frozen=True)
class Phase:
    name: str
    streams: int
    seconds: float
    tokens: int = 0
    pace_ms: float = 0


# Idle phases long enough for Serve's look-back (15 s), downscale delay (10 s) and, after
# a scale-out of the CPU policy, its grace for replicas still starting (90 s).
PHASES = [
    Phase("slow", streams=32, seconds=60, tokens=120, pace_ms=100),
    Phase("idle", streams=0, seconds=60),
    Phase("fast", streams=6, seconds=60, tokens=256),
    Phase("idle", streams=0, seconds=120),
]


@dataclass
class Request:
    phase: str
    started_s: float
    tpot_ms: float | None
    tokens: int
    ok: bool
    ended_s: float


@dataclass
class Tick:
    t_s: float
    phase: str
    replicas: int
    cores: float
    """Cores the Derender replicas used over the last second, together."""


@dataclass
class Run:
    signal: str
    requests: list[Request] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    decisions: list[tuple[float, str]] = field(default_factory=list)
    """Serve's controller deciding Derender's replicas: (seconds from the start, line)."""
    phase_starts: list[float] = field(default_factory=list)
    """When each phase began, seconds from the run's start: a phase with load ends
    when its last stream does, so the next begins after that."""


def graph_args(signal: str) -> dict[str, Any]:
    return {
        "model": str(TINY_MODEL),
        "reasoning_parser": "qwen3",
        "tool_call_parser": "hermes",
        "max_model_len": 4096,
        "kv_cache_gib": 1,
        "text_placement": "tier",
        "logits_processors": ["bench.harness.paced_decode:PacedDecode"],
        "derender": {
            "num_cpus": DERENDER_NUM_CPUS,
            "autoscaling": {**SCALING, **SIGNALS[signal]},
        },
    }


def derender_cpu_s(port: int) -> dict[int, float]:
    """CPU seconds so far of each Derender replica process (starting ones too) of the
    graph listening on ``port`` (``bench.observe``)."""
    now = sample(0.0, "default", port)
    return {pid: cpu for pid, (tier, cpu) in now.cpu_s.items() if tier == "Derender"}


class Sampler(threading.Thread):
    def __init__(self, run: Run, start: float, port: int) -> None:
        super().__init__(daemon=True)
        self.run_, self.start_, self.phase, self.port = run, start, "warm-up", port
        self.stopped = threading.Event()

    def run(self) -> None:
        before = derender_cpu_s(self.port)
        while not self.stopped.wait(1.0):
            now = derender_cpu_s(self.port)
            cores = sum(cpu - before.get(pid, cpu) for pid, cpu in now.items())
            self.run_.ticks.append(
                Tick(round(time.monotonic() - self.start_, 1), self.phase, len(now), cores)
            )
            before = now


async def one_stream(base_url: str, phase: Phase, start: float) -> Request:
    body = long_chat(PROMPT, phase.tokens, phase.pace_ms or None)
    timed = await timed_chat(f"{base_url}/v1/chat/completions", body, timeout_s=300)
    ended = round(time.monotonic() - start, 2)
    started = round(timed.started - start, 2)
    return Request(phase.name, started, timed.text_tpot_ms, timed.tokens, timed.ok, ended)


async def run_phases(base_url: str, run: Run, sampler: Sampler, start: float) -> None:
    for phase in PHASES:
        sampler.phase = phase.name
        run.phase_starts.append(round(time.monotonic() - start, 2))
        end = time.monotonic() + phase.seconds

        async def worker(phase: Phase = phase, end: float = end) -> None:
            while time.monotonic() < end:
                run.requests.append(await one_stream(base_url, phase, start))

        await asyncio.gather(*(worker() for _ in range(phase.streams)))
        await asyncio.sleep(max(0.0, end - time.monotonic()))
    run.phase_starts.append(round(time.monotonic() - start, 2))


def run_signal(signal: str, work: Path) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    run = Run(signal)
    with running_graph(work, {"default": ("/", graph_args(signal))}) as server:
        # A few streams first: the engine's and the tier's first calls are slow.
        warm = Phase("warm-up", streams=4, seconds=5, tokens=32)
        uvloop.run(_warm(server.base_url, warm))
        time.sleep(30)  # the warm-up's load out of Serve's look-back window
        start, wall_start = time.monotonic(), time.time()
        sampler = Sampler(run, start, urlsplit(server.base_url).port or 80)
        sampler.start()
        try:
            uvloop.run(run_phases(server.base_url, run, sampler, start))
        finally:
            sampler.stopped.set()
            sampler.join()
        run.decisions = controller_decisions(wall_start)
    return run


_DECISION = re.compile(
    r"^\S+ (\S+ \S+) controller .*((?:Up|Down)scaling Deployment\(name='Derender'.*)$"
)


def controller_decisions(since: float) -> list[tuple[float, str]]:
    """Serve's controller's Derender scaling lines since ``since`` (the Ray session this
    host runs now, ``serve run``'s own), with what it saw then."""
    found = []
    for log in Path("/tmp/ray/session_latest/logs/serve").glob("controller_*.log"):
        for line in log.read_text(errors="replace").splitlines():
            match = _DECISION.match(line)
            if match:
                stamp = calendar.timegm(time.strptime(match[1][:19], "%Y-%m-%d %H:%M:%S"))
                if stamp >= since - 1:
                    found.append((round(stamp - since, 1), match[2]))
    return sorted(found)


async def _warm(base_url: str, phase: Phase) -> None:
    await asyncio.gather(*(one_stream(base_url, phase, 0) for _ in range(phase.streams)))


def main() -> None:
    from bench.scaling.report import write_report

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/autoscaling-signals.md"))
    parser.add_argument("--work", type=Path, default=None, help="results.json goes here")
    parser.add_argument("--report-only", action="store_true", help="re-write from --work")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    saved = work / "results.json"
    if args.report_only:
        data = json.loads(saved.read_text())
    else:
        runs = [run_signal(signal, work / signal) for signal in SIGNALS]
        data = {
            "host": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "runs": [asdict(r) for r in runs],
        }
        saved.write_text(json.dumps(data))
        print(f"results: {saved}", flush=True)
    write_report(data, args.out)
