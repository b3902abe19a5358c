"""A CPU engine's cores: how many (``engine_core_count``), which (``claim_cores``, apart
from the host's other engines), and ``started_on``: the engine's processes on them,
the replica's threads where they were."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from deployments.vllm_adapter.engine_start import claim_cores, engine_core_count, started_on


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


@pytest.mark.parametrize(
    ("setting", "assigned", "expected"),
    [
        ("auto", None, 1),  # Ray's OMP_NUM_THREADS: an actor without CPUs gets 1
        ("auto", 0.3, 1),
        ("auto", 2.5, 2),
        ("off", 4.0, None),
        (3, 1.0, 3),
    ],
)
def test_an_engine_binds_as_many_cores_as_ray_gives_it_threads(
    setting: Any, assigned: float | None, expected: int | None
) -> None:
    assert engine_core_count(setting, assigned) == expected


def test_engines_on_one_host_claim_cores_apart(tmp_path: Path) -> None:
    first = claim_cores([0, 1, 2, 3], 2, 0, tmp_path)
    second = claim_cores([3, 2, 1, 0], 2, 0, tmp_path)
    assert (first.cores, second.cores) == ([0, 1], [2, 3])
    # None left: the rank's cores, shared, and nothing more held.
    assert claim_cores([0, 1, 2, 3], 2, 1, tmp_path).cores == [2, 3]
    first.release()
    assert claim_cores([0, 1, 2, 3], 2, 1, tmp_path).cores == [0, 1]
    second.release()


def _hold_a_claim(claims: Path, held: Any, finish: Any) -> None:
    claim = claim_cores([0, 1], 1, 0, claims)
    held.put(claim.cores)
    finish.wait(timeout=60)


def test_a_claim_ends_with_its_process(tmp_path: Path) -> None:
    """A replica that dies (or its host's kill) frees its cores for the next one."""
    context = multiprocessing.get_context("spawn")
    held = context.Queue()
    finish = context.Event()
    child = context.Process(target=_hold_a_claim, args=(tmp_path, held, finish))
    child.start()
    assert held.get(timeout=60) == [0]
    beside = claim_cores([0, 1], 1, 0, tmp_path)
    assert beside.cores == [1]
    finish.set()
    child.join(timeout=60)
    beside.release()
    assert claim_cores([0, 1], 1, 1, tmp_path).cores == [0]


def test_without_a_claims_folder_each_replica_takes_its_ranks_cores(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert claim_cores([0, 1], 1, 1, blocked / "claims").cores == [1]
    assert claim_cores([0, 1], 1, 1, blocked / "claims").cores == [1]


def test_the_kv_cache_use_logger_keeps_the_schedulers_last_reading() -> None:
    from types import SimpleNamespace

    from vllm.v1.metrics.loggers import StatLoggerBase

    from deployments.vllm_adapter.engine_load import KvCacheUse, kv_cache_use

    logger = KvCacheUse(vllm_config=None)
    assert isinstance(logger, StatLoggerBase) and kv_cache_use() is None
    logger.record(SimpleNamespace(kv_cache_usage=0.25), None)
    logger.record(None, None)  # a step with iteration stats only: the reading stays
    assert kv_cache_use() == 0.25
