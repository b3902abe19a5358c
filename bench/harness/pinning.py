"""Cores for a local cluster's nodes: each node's processes on cores of its own.

Every node of a local cluster runs on this host, so without this they share its
cores and nothing one node does is offloaded from another. Here the processes of
each worker node (its raylet and everything under it: agents, Ray workers, Serve
replicas, vLLM's engine processes, and every thread of each) are given a node
group's cores, and the rest of the cluster (the head: GCS, dashboard, Serve's
controller and proxy, the autoscaler) other cores. A process a pinned one starts
later inherits its cores (Linux keeps the affinity across fork and exec), so the
replicas Serve places after pinning run where their node does.

Read back from ``/proc/<pid>/status`` (``Cpus_allowed_list``) for every process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

# What the fake provider sets in each worker raylet's environment (its node group).
NODE_TYPE_VARIABLE = "RAY_NODE_TYPE_NAME"
HEAD = "head"
TITLE_CHARS = 120  # a raylet's command line runs to kilobytes


def set_cores(pid: int, cores: Iterable[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (``taskset -a -p``: an affinity is per
    thread, and the threads a process has already started keep theirs)."""
    wanted = set(cores)
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(task.name), wanted)


def add_vllm_engine_cores(parser: argparse.ArgumentParser) -> None:
    """``--vllm-engine-cores``: a bench's vLLM server with its engine bound as a Generate
    replica binds its own (``bind_engine``)."""
    parser.add_argument(
        "--vllm-engine-cores",
        type=lambda s: [int(c) for c in s.split(",")],
        default=None,
        help="bind vLLM's engine processes (EngineCore and worker, every thread) to these "
        "cores once its server is up, as the graph binds its own (default: unbound)",
    )


def _titles(root: int) -> Iterator[tuple[str, psutil.Process]]:
    """Each live process under ``root`` with its title (its command line, as vLLM and Ray
    set it, or its name); zombies and processes gone meanwhile left out."""
    for child in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            yield " ".join(child.cmdline()) or child.name(), child


def engine_processes(root: int) -> tuple[psutil.Process, psutil.Process]:
    """vLLM's engine processes under ``root``: its ``VLLM::EngineCore`` and its
    ``VLLM::Worker`` (one engine, one worker); else a LookupError."""
    found: dict[str, psutil.Process] = {}
    for title, child in _titles(root):
        for name in ("VLLM::EngineCore", "VLLM::Worker"):
            if title.startswith(name):
                found[name] = child
    if len(found) != 2:
        raise LookupError(f"no vLLM EngineCore and Worker under {root}: {sorted(found)}")
    return found["VLLM::EngineCore"], found["VLLM::Worker"]


def bind_engine(root: int, cores: Iterable[int]) -> int:
    """vLLM's engine processes under ``root`` (``VLLM::EngineCore``, ``VLLM::Worker``),
    every thread, onto ``cores``, as a Generate replica binds its engine
    (``generate.cpu_cores``); how many were bound. None: a LookupError."""
    wanted = list(cores)
    engines = [child for title, child in _titles(root) if title.startswith("VLLM::")]
    if not engines:
        raise LookupError(f"no vLLM engine process under {root}")
    for engine in engines:
        set_cores(engine.pid, wanted)
    return len(engines)


def allowed_cores(pid: int) -> str:
    """The kernel's list of the cores ``pid``'s threads may run on, e.g. ``0`` or
    ``0-1``; threads that differ are listed apart (``0 | 0-1``)."""
    lists = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    lists.add(line.split(":", 1)[1].strip())
    if not lists:
        raise LookupError(f"no Cpus_allowed_list for {pid}")
    return " | ".join(sorted(lists))


def cores_text(cores: Iterable[int]) -> str:
    """``cores`` as the kernel lists them (``0-1,3``)."""
    ordered = sorted(set(cores))
    runs: list[list[int]] = []
    for core in ordered:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def node_group(raylet: psutil.Process) -> str | None:
    """The node group a worker raylet was started for; None for the head's."""
    try:
        return raylet.environ().get(NODE_TYPE_VARIABLE)
    except psutil.Error:
        return None


@dataclass(frozen=True)
class Placed:
    """One process of the cluster and where it may run."""

    group: str
    """Its node's group, or ``head``."""
    pid: int
    title: str
    cores: str


def by_group(processes: Iterable[psutil.Process]) -> dict[int, str]:
    """Each process's node group: a worker raylet's own and its descendants', ``head``
    for the rest."""
    processes = list(processes)
    group = {p.pid: HEAD for p in processes}
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if proc.name() != "raylet":
                continue
            name = node_group(proc)
            if name is None:
                continue
            group[proc.pid] = name
            for child in proc.children(recursive=True):
                group[child.pid] = name
    return group


def pin(processes: Iterable[psutil.Process], cores: dict[str, set[int]]) -> None:
    """Each process onto its group's cores (``cores[HEAD]`` for the head's)."""
    processes = list(processes)
    for pid, group in by_group(processes).items():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            set_cores(pid, cores[group])


def placement(processes: Iterable[psutil.Process]) -> list[Placed]:
    """Where every process may run now, read back from the kernel."""
    processes = list(processes)
    groups = by_group(processes)
    placed = []
    for proc in processes:
        with contextlib.suppress(psutil.Error, FileNotFoundError, ProcessLookupError):
            title = (" ".join(proc.cmdline()) or proc.name())[:TITLE_CHARS]
            placed.append(Placed(groups[proc.pid], proc.pid, title, allowed_cores(proc.pid)))
    return placed
