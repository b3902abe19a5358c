"""Where each replica's CPU goes per request: py-spy on the graph under the short-chat load.

    python -m bench.requests.profile --out docs/request-profile.md

``serve run graph:app`` with ``make run``'s switches, warmed up, then for each
serving replica in turn (Ingress, Render and Generate under inline text,
Derender and Generate under tier text) py-spy samples the replica while the
closed-loop load of ``bench.requests`` runs at ``--concurrency``. Only samples
of the thread that holds the GIL count (``--gil``): the Python work and what it
calls. Each stage below is the share of those samples with the stage's frame
anywhere in the stack (stages nest, so shares overlap), turned into CPU ms per
request with the replica's CPU per request. Then each replica is sampled the
same way over ``--idle-s`` seconds of no traffic: what an idle graph spends.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.harness.host import host_line
from bench.harness.servers import VENV_BIN, Server
from bench.requests.load import ShortChats, closed_loop
from bench.requests.processes import kind_of
from bench.requests.study import graph_server
from deployments.config.graph_config import TINY_MODEL
from deployments.config.serve_env import SERVE_ENV

# The project's and vLLM's code, which a call into a replica runs (the stages below count
# it; Serve's side of the call is what is left).
USER_CODE = ("(deployments/", "(vllm/")
# (stage, frame names any of which in a stack puts the sample in the stage)
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP server: uvicorn, Starlette, FastAPI", ("RequestResponseCycle.run_asgi",)),
    ("  writing the response (SSE chunks)", ("RequestResponseCycle.send",)),
    ("  body parsed and validated (pydantic)", ("validate (deployments/edge/validation.py",)),
    ("Serve: routing and sending a handle call", ("AsyncioRouter.assign_request",)),
    (
        "Serve: a handle call's items read back",
        ("DeploymentResponseGenerator.__anext__", "DeploymentResponse.__await__"),
    ),
    (
        "Serve: a call taken in by the replica, less the code it runs",
        ("Replica.handle_request_with_rejection", "_wrap_grpc_call"),
    ),
    ("pickling between tiers (both ways)", ("cloudpickle.py", "RPCSerializer.")),
    ("vLLM: rendering (chat template, tokens)", ("ServingRender.",)),
    ("vLLM: parsers built (per request)", ("Parser.__init__",)),
    ("vLLM: engine client (AsyncLLM)", ("AsyncLLM.",)),
    ("vLLM: token stream as SSE (ServingTokens)", ("ServingTokens.",)),
    ("text: stream derenderer", ("ChatStreamDerenderer.feed",)),
    ("text: SSE parsed back to chunks", ("sse_stream_payloads",)),
    ("logging", ("Logger._log",)),
    ("metrics (Serve's and vLLM's)", ("Metric._record", "StatLoggerManager.record")),
]
PROFILED = {"inline": ("Ingress", "Render", "Generate"), "tier": ("Derender", "Generate")}
IDLE_KINDS = ("Ingress", "Render", "Generate", "Derender", "AbortFanout")


@dataclass
class Profile:
    mode: str
    kind: str
    requests: int
    cpu_ms_per_request: float
    """The replica's CPU, every thread, from the process table."""
    gil_ms_per_request: float
    """Time a thread of the replica held the GIL, from py-spy's samples."""
    samples: int
    stage_share: dict[str, float] = field(default_factory=dict)
    top_self: list[tuple[str, float]] = field(default_factory=list)


def replica_pids(server: Server) -> dict[str, int]:
    """One process of each serving deployment under the graph."""
    assert server.process is not None
    pids: dict[str, int] = {}
    for process in psutil.Process(server.process.pid).children(recursive=True):
        try:
            kind = kind_of(" ".join(process.cmdline()), process.name())
        except psutil.Error:
            continue
        pids.setdefault(kind, process.pid)
    return pids


def stacks(raw: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: each stack's frames, root first, and its count."""
    out = []
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.append((stack.split(";"), int(count)))
    return out


def attribute(samples: list[tuple[list[str], int]], top: int) -> tuple[dict[str, float], list]:
    """Each stage's share of the samples, and the ``top`` frames by self share."""
    total = sum(count for _, count in samples) or 1
    shares: dict[str, float] = {}
    for stage, frames in STAGES:
        unless = USER_CODE if stage.startswith("Serve: a call taken in") else ()
        hit = sum(
            c
            for stack, c in samples
            if any(f in s for s in stack for f in frames)
            and not any(u in s for s in stack for u in unless)
        )
        shares[stage] = hit / total
    leaves: Counter[str] = Counter()
    for stack, count in samples:
        leaves[stack[-1].rsplit(":", 1)[0] + ")"] += count
    return shares, [(frame, n / total) for frame, n in leaves.most_common(top)]


def spied(pid: int, rate: int, work: Callable[[], object]) -> tuple[list, float]:
    """py-spy's samples of ``pid`` and its CPU seconds while ``work()`` runs."""
    raw = Path(tempfile.mkstemp(prefix="spy-", suffix=".txt")[1])
    spy = subprocess.Popen(
        [str(VENV_BIN / "py-spy"), "record", "--pid", str(pid), "--rate", str(rate),
         "--format", "raw", "--output", str(raw), "--gil", "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1)  # py-spy attached before the work starts
    process = psutil.Process(pid)
    before = sum(process.cpu_times()[:2])
    work()
    cpu = sum(process.cpu_times()[:2]) - before
    spy.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
    spy.wait(timeout=60)
    samples = stacks(raw)
    raw.unlink()
    return samples, cpu


def profile_one(
    server: Server, pid: int, kind: str, mode: str, load: ShortChats, args: argparse.Namespace
) -> Profile:
    headers = {"X-Text-Placement": mode}
    timings: list = []

    def work() -> None:
        timings.extend(
            asyncio.run(
                closed_loop(server.base_url, load, args.concurrency, args.requests, headers)
            )[0]
        )

    samples, cpu = spied(pid, args.rate, work)
    shares, top = attribute(samples, args.top)
    count = sum(c for _, c in samples)
    n = len(timings)
    gil_ms = count / args.rate / n * 1000
    return Profile(mode, kind, n, cpu / n * 1000, gil_ms, count, shares, top)


@dataclass
class Idle:
    kind: str
    cpu_share: float
    """Of one core, every thread, from the process table."""
    gil_share: float
    top_self: list[tuple[str, float]]


def profile_idle(pid: int, kind: str, args: argparse.Namespace) -> Idle:
    samples, cpu = spied(pid, args.rate, lambda: time.sleep(args.idle_s))
    count = sum(c for _, c in samples)
    _, top = attribute(samples, args.top)
    return Idle(kind, cpu / args.idle_s, count / args.rate / args.idle_s, top)


def report(args: argparse.Namespace, profiles: list[Profile], idle: list[Idle]) -> str:
    lines = [
        "# Where each replica's CPU goes per request",
        "",
        f"`{' '.join(['python -m bench.requests.profile', *sys.argv[1:]])}`",
        "",
        f"Host: {host_line()}. `serve run graph:app` with "
        f"`make run`'s switches; streamed chats of {args.tokens} tokens in a closed loop at "
        f"concurrency {args.concurrency}, {args.requests} requests per replica profiled, "
        f"py-spy at {args.rate} Hz on the thread holding the GIL. *CPU*: the replica's, "
        "every thread, from the process table over the load; *GIL held*: py-spy's samples "
        "over the same load (the rest is native work outside the GIL: gRPC's and Ray's "
        "C++ threads, tokenizers). A stage's share counts the samples with one of its "
        "frames anywhere in the stack (stages nest and overlap); its ms/request is that "
        "share of the replica's CPU per request. On this oversubscribed host GIL-held time "
        "can run above CPU time (a thread the kernel preempts still holds the GIL), so the "
        "shares are the measure and the ms a guide. py-spy's sampling takes CPU of its "
        "own, so the absolute figures run above `bench.requests`' "
        "(docs/request-overhead.md).",
        "",
    ]
    for p in profiles:
        lines += [
            f"## {p.kind}, {p.mode} text: {p.cpu_ms_per_request:.1f} CPU ms per request",
            "",
            f"GIL held {p.gil_ms_per_request:.1f} ms per request ({p.samples} samples over "
            f"{p.requests} requests).",
            "",
            "| stage | share | ms/request |",
            "|---|---|---|",
        ]
        for stage, share in p.stage_share.items():
            if share >= 0.005:
                ms = share * p.cpu_ms_per_request
                lines.append(f"| {stage} | {share:.0%} | {ms:.2f} |")
        lines += ["", "Frames with the most samples of their own:", ""]
        lines += [f"- {share:.1%} `{frame}`" for frame, share in p.top_self]
        lines.append("")
    if idle:
        lines += [
            f"## Idle: each replica over {args.idle_s:g} s of no traffic",
            "",
            "CPU as a share of one core (every thread), the time a thread held the GIL, "
            "and the frames that held it most.",
            "",
        ]
        for i in idle:
            lines += [f"### {i.kind}: CPU {i.cpu_share:.1%}, GIL held {i.gil_share:.1%}", ""]
            lines += [f"- {share:.1%} `{frame}`" for frame, share in i.top_self]
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=400, help="per replica profiled")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--idle-s", type=float, default=30, help="each replica idle; 0: none")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load = ShortChats(model=str(TINY_MODEL), tokens=args.tokens)
    profiles = []
    with (
        tempfile.TemporaryDirectory(prefix="profile-") as tmp,
        graph_server(Path(tmp), dict(SERVE_ENV), []) as server,
    ):
        for mode in PROFILED:
            asyncio.run(closed_loop(server.base_url, load, 4, 32, {"X-Text-Placement": mode}))
        pids = replica_pids(server)
        for mode, kinds in PROFILED.items():
            for kind in kinds:
                profiles.append(profile_one(server, pids[kind], kind, mode, load, args))
                per_request = profiles[-1].cpu_ms_per_request
                print(f"{kind} ({mode}): {per_request:.1f} ms/request", flush=True)
        idle = []
        if args.idle_s > 0:
            time.sleep(5)  # the load's last work (metric pushes, logs) drains
            for kind in IDLE_KINDS:
                idle.append(profile_idle(pids[kind], kind, args))
                print(f"{kind} idle: {idle[-1].cpu_share:.1%} of a core", flush=True)
    text = report(args, profiles, idle)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
