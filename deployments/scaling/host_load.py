"""How busy a replica's host is, as ``text_placement: auto`` weighs it
(``routing/text_placement.py``).

Two figures per Generate or Derender replica, each over the time since its last reading:

- ``host_busy``: the share of the CPUs this process may run on (its affinity) that were
  busy, every process on them counted (``/proc/stat``). For Generate that is the engine
  host's headroom: what inline text work there takes from the engine next to it.
- ``loop_busy``: the share of wall time the replica's event-loop thread ran or waited
  to run (``/proc/thread-self/schedstat``). Near 1 the thread is saturated: one Python
  thread serves every stream of the replica, however many cores the host has.

``cpus`` names the host by its kernel (``boot_id``: containers of one machine share it)
and its CPUs, so the Ingress can tell whether the tier runs on other cores than the
engine at all. CPU quotas of a container (cgroups) are not read: ``host_busy`` is the
whole CPU's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from deployments.messages.control import HostLoad, Tier

# Readings closer together than this return the last one: several Ingress replicas
# ask, and a window this short says little about a CPU.
MIN_WINDOW_S = 0.5
_PROC_STAT = Path("/proc/stat")
_SCHEDSTAT = Path("/proc/thread-self/schedstat")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def read_cpu_times(cpus: frozenset[int], text: str | None = None) -> tuple[float, float]:
    """(busy, total) jiffies of these CPUs, from ``/proc/stat``'s ``cpuN`` lines."""
    busy = total = 0.0
    for line in (text if text is not None else _PROC_STAT.read_text()).splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        fields = [float(v) for v in rest.split()]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        # guest time is already in user and nice: count the first eight fields only
        all_time = sum(fields[:8])
        busy += all_time - idle
        total += all_time
    return busy, total


def read_thread_ns() -> float:
    """Nanoseconds the calling thread has run plus waited on a run queue."""
    ran, waited, *_ = _SCHEDSTAT.read_text().split()
    return float(ran) + float(waited)


def host_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return os.uname().nodename


class HostSampler:
    """One replica's readings; call :meth:`reading` from its event-loop thread."""

    def __init__(
        self,
        tier: Tier,
        replica: str,
        *,
        affinity: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
        cpu_times: Callable[[frozenset[int]], tuple[float, float]] = read_cpu_times,
        thread_ns: Callable[[], float] = read_thread_ns,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tier, self._replica, self._host = tier, replica, host_id()
        self._affinity, self._cpu_times, self._thread_ns = affinity, cpu_times, thread_ns
        self._clock = clock
        self._last: tuple[float, frozenset[int], tuple[float, float], float] | None = None
        self._reading: HostLoad | None = None

    def reading(self) -> HostLoad | None:
        """Busy shares since the last reading; None at the first (no window yet)."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < MIN_WINDOW_S:
            return self._reading
        cpus = frozenset(self._affinity())
        times, ran = self._cpu_times(cpus), self._thread_ns()
        last, self._last = self._last, (now, cpus, times, ran)
        if last is None:
            return None
        if last[1] != cpus:
            # Re-pinned: the window starts here, but the CPUs are news at once (whether
            # the tier still has cores of its own); the busy shares stay the last ones.
            if self._reading is not None:
                self._reading = self._reading.model_copy(update={"cpus": sorted(cpus)})
            return self._reading
        wall = now - last[0]
        busy, total = times[0] - last[2][0], times[1] - last[2][1]
        self._reading = HostLoad(
            tier=self._tier,
            replica=self._replica,
            host=self._host,
            cpus=sorted(cpus),
            host_busy=min(max(busy / total, 0.0), 1.0) if total > 0 else 0.0,
            loop_busy=min(max((ran - last[3]) / 1e9 / wall, 0.0), 1.0),
        )
        return self._reading
