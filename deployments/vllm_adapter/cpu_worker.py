"""vLLM's CPU worker, with seeded requests' sampling generators rewound correctly.

vLLM samples a token for every request in a step, then drops the token of a
request still in chunked prefill and rewinds that request's generator "as if
the token was not sampled". The rewind (``GPUModelRunner._bookkeeping_sync``)
moves a CUDA Philox generator's offset back by 4; a CPU generator (MT19937) has
no offset, so ``get_offset`` raises "CPU Generator does not use offset" and the
EngineCore dies. Any request with a ``seed`` and a prompt longer than one
step's token budget (2,048 on CPU) triggers it: without this worker, the
graph's engine (built as ``vllm serve`` builds it) answered such a request with
``EngineDeadError``.

Here the CPU rewind is real: before sampling, the runner saves the state of
each generator whose token will be dropped, and restores it where vLLM would
move the offset. A seeded request then draws exactly the numbers it would draw
unchunked, so the same seed and prompt give the same tokens however the
prompt was split (as on GPU). Selected with vLLM's own ``--worker-cls``; every
private name of vLLM this needs is in this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker


class _NoOffset:
    """Stands in for a CPU generator while vLLM's offset rewind runs: a no-op."""

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass


class SeededRewindCPUModelRunner(CPUModelRunner):
    _dropped_states: dict[int, torch.Tensor]

    def _discarded_generators(self) -> dict[int, torch.Generator]:
        """Generators of this step's requests whose sampled token vLLM drops."""
        num_reqs = self.input_batch.num_reqs
        indices = np.nonzero(self.discard_request_mask.np[:num_reqs])[0]
        generators = self.input_batch.generators
        return {int(i): generators[int(i)] for i in indices if int(i) in generators}

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        # Only seeded requests have generators; other traffic pays nothing here.
        self._dropped_states = (
            {i: gen.get_state() for i, gen in self._discarded_generators().items()}
            if self.input_batch.generators
            else {}
        )
        return super()._sample(logits, spec_decode_metadata)

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        # _sample ran first in this step (vLLM's sample_tokens), over the same batch.
        saved, self._dropped_states = getattr(self, "_dropped_states", {}), {}
        if not saved:
            return super()._bookkeeping_sync(*args, **kwargs)
        generators = self.input_batch.generators
        real = {i: generators[i] for i in saved}
        for i, gen in real.items():
            gen.set_state(saved[i])  # as if the dropped token was never drawn
            generators[i] = _NoOffset()  # type: ignore[assignment]
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            generators.update(real)


class SeededRewindCPUWorker(CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        # CPUWorker builds its runner inline; the V1 runner gets our two
        # overrides (no state of its own beyond what _sample sets).
        if type(self.model_runner) is CPUModelRunner:
            self.model_runner.__class__ = SeededRewindCPUModelRunner
