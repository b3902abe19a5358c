"""What a CPU-tier replica tells Serve's autoscaler: the cores it used and its work rate.

Serve calls a replica's ``record_autoscaling_stats`` every ``look_back_period_s`` × 0.2
and aggregates the values over the look-back window (``cpu_policy.py`` reads them).
The cores are the replica process's CPU time (every thread: the replica's event loop,
its tokenizer pool, Ray's own threads) over the wall time since the last report: what
the replica costs its node, which is what a CPU tier is scaled on.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from deployments.scaling.cpu_policy import CPU_CORES, WORK_PER_S


class CpuLoad:
    """Counts a replica's work; reports its use since the last report.

    The first report gives no figure and starts the first window, as Kubernetes' HPA
    leaves out a pod's CPU from before it is ready: Serve asks for it once the
    replica's ``__init__`` returns, and until then the process was busy with its own
    start: vLLM's renderer and tokenizer loaded, then Serve's start of the replica
    (0.4–0.5 s of CPU in the 0.7–1.0 s from ``__init__``'s end to that first report,
    measured on the cluster tests' graph). Taken as load, it scaled every idle tier out
    at each replica start.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self._clock, self._cpu_clock = clock, cpu_clock
        self._work = 0
        self._since: tuple[float, float, int] | None = None

    def did(self, work: int) -> None:
        """``work`` more units done (tokens derendered, prompts rendered)."""
        self._work += work

    def report(self) -> dict[str, float]:
        """Cores used and work per second since the last report; nothing at the first
        (Serve's policy then leaves the replica out, as one that has not reported)."""
        now, cpu, work = self._clock(), self._cpu_clock(), self._work
        since, self._since = self._since, (now, cpu, work)
        if since is None:
            return {}
        wall_0, cpu_0, work_0 = since
        wall = now - wall_0
        if wall <= 0:
            return {CPU_CORES: 0.0, WORK_PER_S: 0.0}
        return {CPU_CORES: max(cpu - cpu_0, 0.0) / wall, WORK_PER_S: (work - work_0) / wall}
