"""The test-only paced-decode logits processor: which requests hold a step, and how long.

Read from the sleeps it asks for, not from a clock: a loaded host stretches any
step, so only the requested pace says what the processor decided.
"""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from bench.harness import paced_decode
from bench.harness.paced_decode import PacedDecode


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    asked: list[float] = []
    monkeypatch.setattr(paced_decode.time, "sleep", asked.append)
    return asked


def step(processor: PacedDecode, sleeps: list[float]) -> float:
    """Seconds one decode step is held (0: not at all)."""
    before = len(sleeps)
    logits = torch.zeros(2, 4)
    assert processor.apply(logits) is logits
    held = sleeps[before:]
    assert len(held) <= 1
    return held[0] if held else 0.0


def update(added=(), removed=(), moved=()) -> BatchUpdate:  # type: ignore[no-untyped-def]
    return BatchUpdate(batch_size=2, removed=list(removed), added=list(added), moved=list(moved))


def test_only_requests_that_ask_are_paced_and_only_while_in_the_batch(
    sleeps: list[float],
) -> None:
    processor = PacedDecode(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    processor.update_state(update(added=[(0, SamplingParams(), None, [])]))
    assert step(processor, sleeps) == 0.0
    paced = SamplingParams(extra_args={"pace_ms": 120})
    processor.update_state(update(added=[(1, paced, None, [])]))
    assert step(processor, sleeps) == pytest.approx(0.12)
    # The paced request moves to slot 0 (replacing it), then leaves.
    processor.update_state(update(moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert step(processor, sleeps) == pytest.approx(0.12)
    processor.update_state(update(removed=[0]))
    assert step(processor, sleeps) == 0.0


def test_the_slowest_pace_in_the_batch_holds_the_step(sleeps: list[float]) -> None:
    processor = PacedDecode(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    processor.update_state(
        update(
            added=[
                (0, SamplingParams(extra_args={"pace_ms": 30}), None, []),
                (1, SamplingParams(extra_args={"pace_ms": 80}), None, []),
            ]
        )
    )
    assert step(processor, sleeps) == pytest.approx(0.08)
    processor.update_state(update(removed=[1]))
    assert step(processor, sleeps) == pytest.approx(0.03)


def test_the_cpu_part_of_a_step_is_burnt_and_the_rest_slept(
    sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    burnt: list[float] = []
    monkeypatch.setattr(paced_decode, "burn", burnt.append)
    processor = PacedDecode(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    cpu_paced = SamplingParams(extra_args={"pace_ms": 15, "pace_cpu_ms": 5})
    processor.update_state(update(added=[(0, cpu_paced, None, [])]))
    assert step(processor, sleeps) == pytest.approx(0.010)
    assert burnt == [pytest.approx(0.005)]
    # Never more CPU than the step: a step of CPU work alone sleeps not at all.
    all_cpu = SamplingParams(extra_args={"pace_ms": 15, "pace_cpu_ms": 40})
    processor.update_state(update(added=[(0, all_cpu, None, [])]))
    assert step(processor, sleeps) == 0.0
    assert burnt[-1] == pytest.approx(0.015)
    # Requests that ask for a sleep only burn nothing.
    sleep_only = SamplingParams(extra_args={"pace_ms": 15})
    processor.update_state(update(added=[(0, sleep_only, None, [])]))
    assert step(processor, sleeps) == pytest.approx(0.015)
    assert len(burnt) == 2


def test_burn_spends_this_threads_cpu_time() -> None:
    import time

    before = time.thread_time()
    paced_decode.burn(0.02)
    assert time.thread_time() - before >= 0.02
