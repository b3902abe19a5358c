"""The test-only paced-decode logits processor: which requests hold a step, and how long."""

from __future__ import annotations

import time

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from tests.support.paced_decode import PacedDecode


def step_s(processor: PacedDecode) -> float:
    logits = torch.zeros(2, 4)
    start = time.monotonic()
    assert processor.apply(logits) is logits
    return time.monotonic() - start


def update(added=(), removed=(), moved=()) -> BatchUpdate:  # type: ignore[no-untyped-def]
    return BatchUpdate(batch_size=2, removed=list(removed), added=list(added), moved=list(moved))


def test_only_requests_that_ask_are_paced_and_only_while_in_the_batch() -> None:
    processor = PacedDecode(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    processor.update_state(update(added=[(0, SamplingParams(), None, [])]))
    assert step_s(processor) < 0.05
    paced = SamplingParams(extra_args={"pace_ms": 120})
    processor.update_state(update(added=[(1, paced, None, [])]))
    assert step_s(processor) >= 0.12
    # The paced request moves to slot 0 (replacing it), then leaves.
    processor.update_state(update(moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert step_s(processor) >= 0.12
    processor.update_state(update(removed=[0]))
    assert step_s(processor) < 0.05
