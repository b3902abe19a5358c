"""What the graph's processes do during a run: replicas per deployment, CPU per tier.

Read from the host's process table, so it needs nothing from the graph and
costs it nothing: every Serve replica is a Ray worker whose title names its
app and deployment (``ray::ServeReplica:<app>:<Deployment>``); a
replica's CPU includes its children (Generate's vLLM engine core and
workers). Serve's HTTP proxy is its own tier, ``proxy``.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import psutil

REPLICA_TITLE = re.compile(r"ServeReplica:(?P<app>[^:\s]+):(?P<deployment>[A-Za-z_]\w*)")
PROXY_TITLE = "ProxyActor"


@dataclass
class Sample:
    """One look at the process table, ``t_s`` seconds from the run start."""

    t_s: float
    replicas: dict[str, int]
    """Live replica processes per deployment."""
    cpu_s: dict[int, tuple[str, float]]
    """Per replica (or proxy) pid: its tier and the CPU seconds of its process tree."""


def _tier_of(process: psutil.Process, app: str) -> str | None:
    try:
        title = " ".join(process.cmdline())
    except psutil.Error:
        return None
    match = REPLICA_TITLE.search(title)
    if match:
        return match["deployment"] if match["app"] == app else None
    return "proxy" if PROXY_TITLE in title and title.startswith("ray::") else None


def tree_cpu_s(process: psutil.Process, *, only: str | None = None) -> float:
    """CPU seconds (user + system) of ``process`` and every descendant alive now;
    with ``only``, of those whose command line holds it."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
            if only is not None and only not in (" ".join(p.cmdline()) or p.name()):
                continue
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def graph_workers(port: int) -> list[psutil.Process]:
    """The Ray workers of the graph whose HTTP ingress listens on ``port``.

    They are the children of the raylet above the listener (Serve's proxy
    actor, or the HAProxy its manager actor runs): another Ray instance on the
    host (or the lingering workers of one just stopped) is not counted.
    """
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status != psutil.CONN_LISTEN or connection.laddr.port != port:
            continue
        if connection.pid is None:
            continue
        try:
            for ancestor in psutil.Process(connection.pid).parents():
                if ancestor.name() == "raylet":
                    return list(ancestor.children())
        except psutil.Error:
            continue
    raise LookupError(f"no Ray Serve ingress listens on port {port}")


def sample(t_s: float, app: str, port: int) -> Sample:
    """Replicas and CPU of ``app``'s deployments (and the proxy) right now."""
    replicas: dict[str, int] = {}
    cpu: dict[int, tuple[str, float]] = {}
    for process in graph_workers(port):
        tier = _tier_of(process, app)
        if tier is None:
            continue
        if tier != "proxy":
            replicas[tier] = replicas.get(tier, 0) + 1
        try:
            cpu[process.pid] = (tier, tree_cpu_s(process))
        except psutil.Error:
            continue
    return Sample(t_s, replicas, cpu)


def cpu_between(first: Sample, last: Sample, seen: list[Sample]) -> dict[str, float]:
    """CPU seconds per tier from ``first`` to ``last``.

    A process that started in between counts from its first sample; one that
    ended in between counts to its last sample (at most one period is lost).
    """
    start: dict[int, tuple[str, float]] = dict(first.cpu_s)
    end: dict[int, tuple[str, float]] = {}
    for s in seen:
        if first.t_s <= s.t_s <= last.t_s:
            for pid, value in s.cpu_s.items():
                start.setdefault(pid, value)
                end[pid] = value
    per_tier: dict[str, float] = {}
    for pid, (tier, cpu) in end.items():
        per_tier[tier] = per_tier.get(tier, 0.0) + cpu - start[pid][1]
    return {tier: round(value, 2) for tier, value in sorted(per_tier.items())}


@dataclass
class Observer:
    """Samples the process table every ``period_s`` until stopped."""

    port: int
    app: str = "default"
    period_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _start: float = field(default_factory=time.monotonic)

    def now(self) -> Sample:
        taken = sample(time.monotonic() - self._start, self.app, self.port)
        self.samples.append(taken)
        return taken

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.now)
            await asyncio.sleep(self.period_s)

    def timeline(self) -> list[dict[str, float | int]]:
        """Rows of (t_s, replicas per deployment) for the report."""
        return [{"t_s": round(s.t_s, 2), **s.replicas} for s in self.samples]
