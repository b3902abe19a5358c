"""``started_on``: the engine's processes on the replica's engine cores, the replica's
threads where they were."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from deployments.vllm_adapter.engine_start import started_on


def _report_affinity(queue: multiprocessing.Queue[set[int]]) -> None:
    queue.put(os.sched_getaffinity(0))


def _spawned_affinity() -> set[int]:
    """The affinity a process started now (by spawn, as vLLM starts its EngineCore in
    a Ray actor) runs with."""
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[set[int]] = context.Queue()
    child = context.Process(target=_report_affinity, args=(queue,))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    return got


@pytest.fixture
def two_cores() -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two cores to confine a process to one of them")
    return allowed


def test_processes_started_inside_run_on_the_engine_cores_only(two_cores: list[int]) -> None:
    with started_on([two_cores[-1]]):
        inside = _spawned_affinity()
    assert inside == {two_cores[-1]}
    assert _spawned_affinity() == set(two_cores)


def test_the_replicas_threads_get_their_cores_back(two_cores: list[int]) -> None:
    """Threads the engine client starts meanwhile (zmq's) run where the replica does."""
    started = threading.Event()
    finish = threading.Event()
    seen: list[set[int]] = []

    def worker() -> None:
        started.set()
        finish.wait(timeout=60)
        seen.append(os.sched_getaffinity(0))

    with started_on([two_cores[0]]):
        thread = threading.Thread(target=worker)
        thread.start()
        started.wait(timeout=60)
        assert os.sched_getaffinity(0) == {two_cores[0]}
    finish.set()
    thread.join(timeout=60)
    assert os.sched_getaffinity(0) == set(two_cores)
    assert seen == [set(two_cores)]


def test_no_cores_changes_nothing() -> None:
    before = os.sched_getaffinity(0)
    with started_on(None):
        assert os.sched_getaffinity(0) == before
    assert os.sched_getaffinity(0) == before
