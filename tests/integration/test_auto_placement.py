"""``X-Text-Placement: auto`` on the real graph: the Ingress reads every replica's host
load through the control plane and places each request from it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from bench.harness.pinning import set_cores
from bench.observe import REPLICA_TITLE, graph_workers
from tests.integration.test_parity_vllm import SHAPES

AUTO = {"X-Text-Placement": "auto"}
# Parsed (the graph runs qwen3's reasoning parser) and long enough to be worth moving.
MOVABLE = {**SHAPES["reasoning"], "max_tokens": 24}


def placed(client: httpx.Client, body: dict[str, object]) -> tuple[str, str]:
    response = client.post("/v1/chat/completions", json=body, headers=AUTO)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    return response.headers["X-Text-Placement"], response.headers["X-Text-Placement-Auto"]


def process_cpu() -> dict[int, tuple[float, str]]:
    """Each process's CPU seconds so far, and a short name."""
    found = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        times = process.info["cpu_times"]
        if times is not None:
            found[process.pid] = (times.user + times.system, process.info["name"] or "")
    return found


def where_the_cpu_went(
    cores_before: list[Any], processes_before: dict[int, tuple[float, str]]
) -> str:
    """Each core's busy and stolen share since ``cores_before``, and the processes
    that used the most CPU since ``processes_before``: what a failure needs to name."""
    cores = []
    for a, b in zip(psutil.cpu_times(percpu=True), cores_before, strict=True):
        total = max(sum(a) - sum(b), 1e-9)
        cores.append(
            f"busy {1 - (a.idle - b.idle) / total:.2f} stolen {(a.steal - b.steal) / total:.2f}"
        )
    used = []
    for pid, (seconds, name) in process_cpu().items():
        if pid in processes_before:
            with contextlib.suppress(psutil.Error):
                cores_of = sorted(psutil.Process(pid).cpu_affinity())
                used.append((seconds - processes_before[pid][0], name, pid, cores_of))
    top = sorted(used, reverse=True)[:6]
    named = [(round(t[0], 1), *t[1:]) for t in top]
    return f"cores {cores}; top processes (cpu s, name, pid, cores) {named}"


def placed_until(client: httpx.Client, wanted: tuple[str, str], timeout_s: float = 40.0) -> None:
    """Auto-placed requests, one after another, until one is placed ``wanted``
    (placement, and the start of the reason)."""
    deadline = time.monotonic() + timeout_s
    seen = []
    cores_before, processes_before = psutil.cpu_times(percpu=True), process_cpu()
    while time.monotonic() < deadline:
        seen.append(placed(client, MOVABLE))
        if seen[-1][0] == wanted[0] and seen[-1][1].startswith(wanted[1]):
            return
        time.sleep(0.3)
    raise AssertionError(
        f"no request placed {wanted} in {timeout_s} s: {seen[-5:]}; "
        + where_the_cpu_went(cores_before, processes_before)
    )


def test_a_short_request_stays_inline(client: httpx.Client) -> None:
    assert placed(client, {**SHAPES["chat"], "max_tokens": 4}) == ("inline", "short")


def test_a_tier_on_the_engines_cores_gets_no_text(client: httpx.Client) -> None:
    # Every replica of this graph may run on every core of the host: the tier has none
    # of its own, which the Ingress can know only from both tiers' readings.
    placed_until(client, ("inline", "shared-cpus"))


def replicas(port: int, deployment: str) -> list[psutil.Process]:
    found = []
    for process in graph_workers(port):
        with contextlib.suppress(psutil.Error):
            match = REPLICA_TITLE.search(" ".join(process.cmdline()))
            if match and match["app"] == "default" and match["deployment"] == deployment:
                found.append(process)
    assert found, deployment
    return found


def everything_but(kept: list[psutil.Process]) -> list[int]:
    """Every user-space process on this machine but ``kept`` and their children: the
    rest of the graph (Ingress, Render, Ray's own), this test, the package's vLLM
    servers the parity tests compare with (which may still be starting), whatever
    else runs here. Left on every core, any of them keeps the tier's core busy."""
    skip = {one.pid for process in kept for one in [process, *process.children(True)]}
    found = []
    for process in psutil.process_iter(["pid", "ppid"]):
        # pid 2 is the kernel's thread parent: its threads are per-core or the kernel's
        if process.pid in skip or process.pid == 2 or process.info["ppid"] in (0, 2):
            continue
        found.append(process.pid)
    return found


@contextlib.contextmanager
def pinned(processes: dict[int, set[int]]) -> Iterator[None]:
    """Each process (every thread) on its cores, and back to where it was after, with
    the processes they started meanwhile (a vLLM server still starting forks its
    engine), which inherited the pinned cores."""
    before = {}
    for pid in processes:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, PermissionError):
            before[pid] = os.sched_getaffinity(pid)
    try:
        for pid, cores in processes.items():
            if pid in before:
                with contextlib.suppress(ProcessLookupError, FileNotFoundError, OSError):
                    set_cores(pid, cores)
        yield
    finally:
        for pid, cores in before.items():
            with contextlib.suppress(psutil.Error, OSError):
                for process in [psutil.Process(pid), *psutil.Process(pid).children(True)]:
                    if process.pid == pid or process.pid not in before:
                        set_cores(process.pid, cores)


@contextlib.contextmanager
def busy_core(core: int) -> Iterator[None]:
    """A process that keeps ``core`` busy: an engine host with no headroom."""
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def test_a_busy_engine_host_sends_text_to_a_tier_on_other_cores(client: httpx.Client) -> None:
    port = urlsplit(str(client.base_url)).port
    assert port is not None
    # The engine host: core 0, which something keeps busy, with each Generate replica
    # and its engine processes. The tier's core: core 1, with the Derender replicas and
    # nothing else. Every other process goes to core 0 too: the tier's reading is its
    # cores' whole load, and this test needs them idle but for the tier's own work.
    tier = replicas(port, "Derender")
    cores = {pid: {0} for pid in everything_but(tier)}
    cores |= {p.pid: {1} for r in tier for p in [r, *r.children(True)]}
    with pinned(cores), busy_core(0):
        placed_until(client, ("tier", "share="))
    # Back on every core: the tier shares the engine's again.
    placed_until(client, ("inline", "shared-cpus"))
