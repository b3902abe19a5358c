"""Serve autoscaling for a CPU tier on its own CPU: replicas near a target utilisation.

Streams per replica (``target_ongoing_requests``) is the wrong signal for a text tier:
a stream of a slow decode costs its Derender replica next to nothing, a long reasoning
stream with tool parsing far more. Each Render and Derender replica reports the cores
it used (``cpu_load.py``, through Serve's ``record_autoscaling_stats``); this policy
asks for as many replicas as keep their mean use at ``target_utilization`` of
``cores_per_replica``, as Kubernetes' HPA does for CPU (with its 10% tolerance).
Serve applies the deployment's min/max replicas, up/downscale delays and scaling
factors around it (``_apply_autoscaling_config``).

Serve's controller loads this module by value (``AutoscalingPolicy``), so it imports
nothing of the project: only the standard library and Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

# What each replica reports (``record_autoscaling_stats``); the names Serve's
# controller aggregates them under over the deployment's ``look_back_period_s``.
CPU_CORES = "cpu_cores"
"""Cores the replica's process used since its last report (1.0: one core, busy)."""
WORK_PER_S = "work_per_s"
"""Its work done per second: tokens derendered (Derender), prompts rendered (Render)."""
# How long after a scale-out its replicas still starting are held (a replica here
# starts in ~25 s). Past it, one still not running is taken as one that will not (no
# node has room for it) and stops holding the tier up.
START_GRACE_S = 90.0


@dataclass(frozen=True)
class CpuTarget:
    target_utilization: float
    """Mean use to keep each replica at, as a share of ``cores_per_replica``."""
    cores_per_replica: float
    """Cores one replica may use: its ``num_cpus`` where it reserves any."""
    tolerance: float = 0.1
    """No change while the mean use is within this share of the target."""

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], not {self.target_utilization}")
        if self.cores_per_replica <= 0:
            raise ValueError(f"cores_per_replica must be above 0, not {self.cores_per_replica}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), not {self.tolerance}")


def utilization(cores: Iterable[float], cores_per_replica: float) -> float | None:
    """The replicas' mean use of their cores; None when none reported yet."""
    used = list(cores)
    if not used:
        return None
    return sum(used) / (len(used) * cores_per_replica)


def desired_replicas(
    cores: Iterable[float],
    current: int,
    target: CpuTarget,
    queued: float = 0.0,
    starting: int = 0,
) -> float:
    """How many replicas keep their mean use at the target (Serve rounds it up).

    ``cores``: what each replica that reported used (replicas that have not reported
    yet, having just started, are left out of the mean); ``current``: the replicas
    running. The tier does not shrink while ``queued`` requests wait at the callers'
    handles (its replicas are short of slots, whatever their CPU says), nor below the
    ``starting`` replicas of a scale-out still under way: the running replicas' CPU
    does not show the load those will take off them, and a tier that stopped them as
    they started would scale out again at once.
    """
    if current <= 0:
        return float(current)
    used = utilization(cores, target.cores_per_replica)
    if used is None:
        return float(current)
    ratio = used / target.target_utilization
    desired = float(current) if abs(ratio - 1) <= target.tolerance else current * ratio
    if queued > 0:
        desired = max(desired, float(current))
    if starting > 0:
        desired = max(desired, float(current + starting))
    return desired


class CpuUtilizationPolicy:
    """A Serve autoscaling policy (``AutoscalingConfig.policy``, a class: Serve makes it
    once with the ``policy_kwargs``) over :func:`desired_replicas`."""

    def __init__(
        self, target_utilization: float, cores_per_replica: float, tolerance: float = 0.1
    ) -> None:
        self.target = CpuTarget(target_utilization, cores_per_replica, tolerance)

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        reported = (ctx.aggregated_metrics or {}).get(CPU_CORES, {})
        cores = [reported[r] for r in ctx.running_replicas if r in reported]
        running = ctx.current_num_replicas
        now = ctx.current_time if ctx.current_time is not None else time.time()
        scaled_out = ctx.last_scale_up_time
        recent = scaled_out is not None and now - scaled_out < START_GRACE_S
        desired = desired_replicas(
            cores,
            running,
            self.target,
            queued=ctx.total_queued_requests or 0.0,
            starting=max(ctx.target_num_replicas - running, 0) if recent else 0,
        )
        used = utilization(cores, self.target.cores_per_replica)
        # Kept by Serve between decisions, for whoever reads the policy's state.
        state: dict[str, Any] = {"replicas_reporting": len(cores)}
        if used is not None:
            state["cpu_utilization"] = used
        return desired, state
