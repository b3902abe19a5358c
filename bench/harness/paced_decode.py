"""A test-only vLLM logits processor: decode steps paced, per request.

The tiny CPU model decodes ~2,000 tokens/s per stream, so a "long" stream is
over in two seconds and several at once flood Serve's one HTTP proxy on this
2-core host. A request that sets ``sampling_params.extra_args["pace_ms"]``
(``vllm_xargs`` on the OpenAI routes) holds every engine step it is in for
that long: a stream that lasts seconds but costs next to nothing. Requests
without it are untouched when they run alone.

A sleep leaves the engine host's CPU free, as a GPU's step does, so text made
beside the engine takes only what the engine did not need. ``pace_cpu_ms``
(at most ``pace_ms``) makes that much of the step CPU work on the engine's own
thread: an engine whose step needs its host's CPU (a CPU model's forward pass,
a GPU engine core's scheduling and input preparation). It is counted in the
thread's CPU time, not the clock's, so a core shared with other work stretches
the step as it would stretch a model's.

Loaded by the engine from the graph config:
``logits_processors: ["bench.harness.paced_decode:PacedDecode"]``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

if TYPE_CHECKING:
    from vllm.config import VllmConfig

PACE_KEY = "pace_ms"
PACE_CPU_KEY = "pace_cpu_ms"


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class PacedDecode(LogitsProcessor):
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        # persistent-batch index → (seconds per step, of which CPU work)
        self._pace_s: dict[int, tuple[float, float]] = {}

    def is_argmax_invariant(self) -> bool:
        # False, so vLLM calls apply() for greedy requests too.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._pace_s.pop(index, None)
        for index, params, _, _ in batch_update.added:
            extra = params.extra_args or {}
            pace_ms = extra.get(PACE_KEY)
            if pace_ms:
                cpu_ms = min(float(extra.get(PACE_CPU_KEY) or 0), float(pace_ms))
                self._pace_s[index] = (float(pace_ms) / 1000, cpu_ms / 1000)
            else:
                self._pace_s.pop(index, None)
        for a, b, direction in batch_update.moved:
            pace_a, pace_b = self._pace_s.pop(a, None), self._pace_s.pop(b, None)
            if pace_a is not None:
                self._pace_s[b] = pace_a
            if pace_b is not None and direction == MoveDirectionality.SWAP:
                self._pace_s[a] = pace_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._pace_s:
            step_s = max(step for step, _ in self._pace_s.values())
            cpu_s = max(cpu for _, cpu in self._pace_s.values())
            if cpu_s:
                burn(cpu_s)
            if step_s > cpu_s:
                time.sleep(step_s - cpu_s)
        return logits
