"""Who spends the CPU and holds the memory: a server's process tree, by kind.

Every process under the server's root (``serve run`` and the Ray cluster it
starts, or vLLM's API server) is read from the host's process table and named by
its title: a Serve replica by its deployment, vLLM's engine processes, Serve's
proxy and controller, HAProxy, and the rest of Ray. Each process counts its own
CPU (not its children's), so a Generate replica and its engine are apart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psutil

from bench.observe import REPLICA_TITLE

ENGINE = "engine"
"""vLLM's engine core and its model worker (``VLLM::*``): the model, and a
spin-wait whose CPU grows with wall time rather than with requests."""
DASHBOARD = "dashboard"
"""Ray's dashboard: its head, the head's module processes and the node's agent."""
LOG_MONITOR = "log monitor"
HAPROXY_MANAGER = "HAProxy manager"
"""Serve's HAProxyManager actor: it only rewrites HAProxy's config; the ``haproxy``
process carries the traffic."""
RAY_OWN = "Ray's own"
"""The rest of Ray: GCS, raylet, runtime-env agent, autoscaler monitor, idle workers."""
KINDS = (
    "haproxy",
    "proxy",
    "API server",
    "Ingress",
    "Render",
    "Generate",
    "Derender",
    "AbortFanout",
    ENGINE,
    "Serve controller",
    HAPROXY_MANAGER,
    DASHBOARD,
    LOG_MONITOR,
    RAY_OWN,
    "serve run CLI",
    "other",
)
_RAY_PROCESSES = (
    "gcs_server",
    "raylet",
    "ray::",
    "runtime_env",
    "autoscaler/_private/monitor.py",
)


def kind_of(cmdline: str, name: str) -> str:
    """The kind of one process, from its command line (Ray and vLLM set titles)."""
    if cmdline.startswith("VLLM::") or name.startswith("VLLM::"):
        return ENGINE
    if match := REPLICA_TITLE.search(cmdline):
        return match["deployment"]
    if "ProxyActor" in cmdline and cmdline.startswith("ray::"):
        return "proxy"
    if "ServeController" in cmdline and cmdline.startswith("ray::"):
        return "Serve controller"
    if name == "haproxy" or cmdline.split(" ", 1)[0].endswith("/haproxy"):
        return "haproxy"
    if "vllm.entrypoints.openai.api_server" in cmdline:
        return "API server"
    if "bin/serve run" in cmdline or cmdline.startswith("serve run"):
        return "serve run CLI"
    if "HAProxyManager" in cmdline and cmdline.startswith("ray::"):
        return HAPROXY_MANAGER
    if "log_monitor" in cmdline:
        return LOG_MONITOR
    if cmdline.startswith(("ray-dashboard-", "ray::DashboardAgent")) or any(
        f"/dashboard/{script}" in cmdline for script in ("dashboard.py", "agent.py")
    ):
        return DASHBOARD
    if any(p in cmdline for p in _RAY_PROCESSES):
        return RAY_OWN
    return "other"


@dataclass
class ProcessSnapshot:
    """One look at a tree: per pid, its kind, CPU seconds so far and memory."""

    cpu_s: dict[int, tuple[str, float]]
    rss: dict[int, tuple[str, int]]
    uss: dict[int, tuple[str, int]]


def snapshot(root_pid: int, *, memory: bool = False) -> ProcessSnapshot:
    """The process tree under ``root_pid`` now (``memory``: also RSS and USS,
    which reads each process's smaps and so is left out of timed windows)."""
    root = psutil.Process(root_pid)
    cpu: dict[int, tuple[str, float]] = {}
    rss: dict[int, tuple[str, int]] = {}
    uss: dict[int, tuple[str, int]] = {}
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            kind = kind_of(" ".join(p.cmdline()), p.name())
            times = p.cpu_times()
            cpu[p.pid] = (kind, times.user + times.system)
            if memory:
                full = p.memory_full_info()
                rss[p.pid] = (kind, full.rss)
                uss[p.pid] = (kind, full.uss)
    return ProcessSnapshot(cpu, rss, uss)


def cpu_by_kind(before: ProcessSnapshot, after: ProcessSnapshot) -> dict[str, float]:
    """CPU seconds per kind between two snapshots; a process born in between
    counts from zero, one that died in between is lost (none should)."""
    spent: dict[str, float] = {}
    for pid, (kind, cpu) in after.cpu_s.items():
        start = before.cpu_s.get(pid, (kind, 0.0))[1]
        spent[kind] = spent.get(kind, 0.0) + cpu - start
    return spent


@dataclass
class Memory:
    processes: int
    rss_mib: float
    uss_mib: float


def memory_by_kind(snap: ProcessSnapshot) -> dict[str, Memory]:
    """Processes, RSS and USS (what only that process holds) per kind."""
    out: dict[str, Memory] = {}
    for pid, (kind, rss) in snap.rss.items():
        m = out.setdefault(kind, Memory(0, 0.0, 0.0))
        m.processes += 1
        m.rss_mib += rss / 2**20
        m.uss_mib += snap.uss[pid][1] / 2**20
    return out
