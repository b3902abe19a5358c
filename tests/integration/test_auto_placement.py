"""``X-Text-Placement: auto`` on the real graph: the Ingress reads every replica's host
load through the control plane and places each request from it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
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


def placed_until(client: httpx.Client, wanted: tuple[str, str], timeout_s: float = 40.0) -> None:
    """Auto-placed requests, one after another, until one is placed ``wanted``
    (placement, and the start of the reason)."""
    deadline = time.monotonic() + timeout_s
    seen = []
    before = psutil.cpu_times(percpu=True)
    while time.monotonic() < deadline:
        seen.append(placed(client, MOVABLE))
        if seen[-1][0] == wanted[0] and seen[-1][1].startswith(wanted[1]):
            return
        time.sleep(0.3)
    busy = [
        round(1 - (a.idle - b.idle) / max(sum(a) - sum(b), 1e-9), 2)
        for a, b in zip(psutil.cpu_times(percpu=True), before, strict=True)
    ]
    raise AssertionError(
        f"no request placed {wanted} in {timeout_s} s: {seen[-5:]}; cores busy {busy}"
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


def other_engines(graph: list[psutil.Process]) -> list[psutil.Process]:
    """This user's vLLM processes outside the graph: the package's vLLM servers the
    parity tests compare with, which may still be starting while this test runs. Left
    on every core they keep the tier's core busy too."""
    mine, skip = os.getuid(), {p.pid for p in graph}
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid in skip or process.uids().real != mine:
                continue
            if process.name().startswith("VLLM::") or "vllm.entrypoints" in " ".join(
                process.cmdline()
            ):
                for one in [process, *process.children(True)]:
                    found[one.pid] = one
    return [p for pid, p in found.items() if pid not in skip]


@contextlib.contextmanager
def pinned(processes: dict[int, set[int]]) -> Iterator[None]:
    """Each process (every thread) on its cores, and back to where it was after, with
    the processes they started meanwhile (a vLLM server still starting forks its
    engine), which inherited the pinned cores."""
    before = {pid: os.sched_getaffinity(pid) for pid in processes}
    try:
        for pid, cores in processes.items():
            set_cores(pid, cores)
        yield
    finally:
        for pid, cores in before.items():
            with contextlib.suppress(psutil.Error, ProcessLookupError, FileNotFoundError):
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
    # The engine host: each Generate replica and its engine processes on core 0, which
    # something else keeps busy; the Derender replicas on core 1. Any other vLLM
    # engine on this host goes to core 0 as well: it is not the tier's load.
    engine_host = [p for r in replicas(port, "Generate") for p in [r, *r.children(True)]]
    tier = replicas(port, "Derender")
    cores = {p.pid: {0} for p in [*engine_host, *other_engines([*engine_host, *tier])]}
    cores |= {r.pid: {1} for r in tier}
    with pinned(cores), busy_core(0):
        placed_until(client, ("tier", "share="))
    # Back on every core: the tier shares the engine's again.
    placed_until(client, ("inline", "shared-cpus"))
