"""A server's whole process tree stopped (SIGSTOP) while another one is measured.

On a 2-core host that other tenants share, the host's speed drifts by 2-3x within
an hour, so servers measured one after another (vLLM's server for ten minutes,
then the graph) compare their hours, not themselves. Holding both up and
alternating short cells puts them side by side in time; stopping the one not
measured keeps its background work (Ray's ticks: a fifth of a core idle) off the
other's cores and off its figures. Stopping every process of a tree at once
leaves its timers and health checks consistent with each other: after SIGCONT
each late tick runs once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

from bench.harness.servers import Server


def _tree(root_pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(root_pid)
        return [root_pid, *(p.pid for p in root.children(recursive=True))]
    return []


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_stopped(pids: list[int], timeout_s: float = 2.0) -> None:
    """Until every process is stopped (a signal lands when the kernel next runs it)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            while process.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
                time.sleep(0.005)


@contextmanager
def frozen(server: Server | None) -> Iterator[None]:
    """``server``'s tree stopped for the block (``None``: nothing to stop); every process
    stopped is continued after it, whatever the block raised."""
    if server is None:
        yield
        return
    pids = _tree(server.process.pid)
    try:
        _signal_all(pids, signal.SIGSTOP)
        _wait_stopped(pids)
        yield
    finally:
        _signal_all(pids, signal.SIGCONT)
