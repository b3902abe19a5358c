"""The CPU autoscaling policy as a pure function, and as Serve loads and calls it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.config.graph_config import GraphConfig
from deployments.scaling.cpu_load import CpuLoad
from deployments.scaling.cpu_policy import (
    CPU_CORES,
    START_GRACE_S,
    WORK_PER_S,
    CpuTarget,
    CpuUtilizationPolicy,
    desired_replicas,
)

TARGET = CpuTarget(target_utilization=0.7, cores_per_replica=1.0)


def test_replicas_above_the_target_ask_for_more_in_proportion() -> None:
    # Two replicas at 1.05 cores each: 1.5× the target → three.
    assert desired_replicas([1.05, 1.05], 2, TARGET) == pytest.approx(3.0)


def test_replicas_below_the_target_ask_for_fewer() -> None:
    # Three replicas at 0.14 cores: a fifth of the target → 0.6 (Serve rounds it up).
    assert desired_replicas([0.14, 0.14, 0.14], 3, TARGET) == pytest.approx(0.6)


def test_use_within_the_tolerance_changes_nothing() -> None:
    assert desired_replicas([0.75, 0.72], 2, TARGET) == 2.0
    assert desired_replicas([0.65, 0.64], 2, TARGET) == 2.0
    # Just past it, it does.
    assert desired_replicas([0.8, 0.8], 2, TARGET) > 2.0


def test_the_cores_a_replica_may_use_set_the_scale() -> None:
    quarter = CpuTarget(target_utilization=0.7, cores_per_replica=0.25)
    # 0.35 cores is 1.4 × a quarter core: twice the target of 0.7.
    assert desired_replicas([0.35], 1, quarter) == pytest.approx(2.0)


def test_queued_requests_keep_the_tier_from_shrinking() -> None:
    assert desired_replicas([0.1, 0.1], 2, TARGET, queued=3) == 2.0
    assert desired_replicas([1.4, 1.4], 2, TARGET, queued=3) == pytest.approx(4.0)


def test_without_reports_the_count_stays() -> None:
    assert desired_replicas([], 2, TARGET) == 2.0
    assert desired_replicas([0.0], 0, TARGET) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_utilization": 0, "cores_per_replica": 1},
        {"target_utilization": 1.2, "cores_per_replica": 1},
        {"target_utilization": 0.7, "cores_per_replica": 0},
        {"target_utilization": 0.7, "cores_per_replica": 1, "tolerance": 1},
    ],
)
def test_a_target_out_of_range_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CpuTarget(**kwargs)


def _context(
    cores: dict[Any, float],
    running: list[Any],
    target: int | None = None,
    scaled_up_s_ago: float | None = None,
) -> AutoscalingContext:
    """Serve's context; replicas named by strings (the policy only matches them up;
    Serve's ``ReplicaID`` is private)."""
    return AutoscalingContext(
        deployment_id=None,  # type: ignore[arg-type]
        deployment_name="Derender",
        app_name="default",
        current_num_replicas=len(running),
        target_num_replicas=len(running) if target is None else target,
        running_replicas=running,
        total_num_requests=3.0,
        total_queued_requests=0.0,
        aggregated_metrics={CPU_CORES: cores, WORK_PER_S: {r: 100.0 for r in cores}},
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=4,
        policy_state={},
        last_scale_up_time=None if scaled_up_s_ago is None else 1000.0 - scaled_up_s_ago,
        last_scale_down_time=None,
        current_time=1000.0,
        config=None,
    )


def test_serve_loads_the_policy_graph_config_names_and_it_reads_the_replicas_reports() -> None:
    config = GraphConfig.from_args(
        {"derender": {"num_cpus": 0.5, "autoscaling": {"policy": "cpu", "max_replicas": 4}}}
    )
    autoscaling = AutoscalingConfig(**config.derender.to_serve(num_cpus=0.5)["autoscaling_config"])
    policy_class = autoscaling.policy.get_policy()  # as Serve's controller loads it
    policy = policy_class(**autoscaling.policy.policy_kwargs)
    assert isinstance(policy, policy_class) and policy_class.__name__ == "CpuUtilizationPolicy"
    one, two, gone = "replica-1", "replica-2", "replica-3"
    # Half a core each (the replica's num_cpus) at 0.7 target: 0.7 cores ask for 2.
    desired, state = policy(_context({one: 0.7, gone: 5.0}, [one]))
    assert desired == pytest.approx(2.0)  # a replica no longer running is not counted
    assert state == {"replicas_reporting": 1, "cpu_utilization": pytest.approx(1.4)}
    desired, _ = policy(_context({one: 0.05, two: 0.05}, [one, two]))
    assert desired < 1


def test_the_policy_class_itself_is_what_the_config_names() -> None:
    config = GraphConfig.from_args({"derender.autoscaling.policy": "cpu"})
    policy = config.derender.to_serve(num_cpus=0.25)["autoscaling_config"]["policy"]
    module, name = policy["policy_function"].split(":")
    assert (module, name) == (CpuUtilizationPolicy.__module__, CpuUtilizationPolicy.__name__)
    assert policy["policy_kwargs"] == {"target_utilization": 0.7, "cores_per_replica": 0.25}


def test_cpu_load_reports_cores_and_work_per_second_since_the_last_report() -> None:
    wall = itertools.count(0.0, 2.0)  # two seconds between reads
    cpu = iter([0.0, 1.0, 1.5, 1.5])
    load = CpuLoad(clock=lambda: next(wall), cpu_clock=lambda: next(cpu))
    assert load.report() == {}  # the first: a window that starts as the replica does
    load.did(300)
    assert load.report() == {CPU_CORES: 0.5, WORK_PER_S: 150.0}
    load.did(20)
    assert load.report() == {CPU_CORES: 0.25, WORK_PER_S: 10.0}
    assert load.report() == {CPU_CORES: 0.0, WORK_PER_S: 0.0}


def test_cpu_load_leaves_out_what_came_before_its_first_report() -> None:
    """A replica's start (seconds of CPU before Serve first asks) is not load."""
    wall = iter([1.0, 7.0])
    cpu = iter([5.5, 5.56])  # 5.5 s of start-up CPU, then 0.01 cores idle
    load = CpuLoad(clock=lambda: next(wall), cpu_clock=lambda: next(cpu))
    load.did(3)
    assert load.report() == {}
    assert load.report() == {CPU_CORES: pytest.approx(0.01), WORK_PER_S: 0.0}


def test_replicas_still_starting_are_not_given_up_for_the_running_ones_cpu() -> None:
    # One running at the target's edge, one more starting: no scale-in to one.
    assert desired_replicas([0.5], 1, TARGET, starting=1) == 2.0
    # More load still asks for more on top.
    assert desired_replicas([2.1], 1, TARGET, starting=1) == pytest.approx(3.0)


def test_replicas_that_never_start_stop_holding_the_tier_up_after_the_grace() -> None:
    """A third replica decided under load but never placed (no node has room) holds the
    tier at three only while it could still be starting."""
    policy = CpuUtilizationPolicy(target_utilization=0.7, cores_per_replica=1.0)
    idle = {"replica-1": 0.02, "replica-2": 0.02}
    running = ["replica-1", "replica-2"]
    just_now = _context(idle, running, target=3, scaled_up_s_ago=10)
    assert policy(just_now)[0] == 3.0
    long_ago = _context(idle, running, target=3, scaled_up_s_ago=START_GRACE_S + 1)
    assert policy(long_ago)[0] == pytest.approx(2 * 0.02 / 0.7)
