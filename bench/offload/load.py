"""What every stream of an offload run asks beyond its cell's step and length."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Load:
    pace_cpu_ms: float = 0.0
    """Of each engine step, CPU work on the engine's thread (``paced_decode.py``): an
    engine that needs its host's CPU every step. 0: the step is a sleep."""
    top_logprobs: int | None = None
    """Each token's logprobs with this many alternatives (an RL rollout's or an eval's
    request), each named as text where the text is made."""

    @classmethod
    def of(cls, args: argparse.Namespace) -> Load:
        return cls(args.pace_cpu_ms, args.top_logprobs)

    @classmethod
    def recorded(cls, args: dict[str, Any]) -> Load:
        """The load a results file records (runs from before these options: the default)."""
        return cls(args.get("pace_cpu_ms") or 0.0, args.get("top_logprobs"))

    def flags(self) -> str:
        """The command-line options that ask for this load."""
        flags = f" --pace-cpu-ms {self.pace_cpu_ms:g}" if self.pace_cpu_ms else ""
        if self.top_logprobs is not None:
            flags += f" --top-logprobs {self.top_logprobs}"
        return flags

    def step_label(self, pace_ms: float) -> str:
        """A step in the tables: its length, and how much of it is CPU work."""
        if not self.pace_cpu_ms:
            return f"{pace_ms:g}"
        return f"{pace_ms:g} ({min(self.pace_cpu_ms, pace_ms):g} CPU)"

    def step_text(self) -> str:
        """What an engine step is, in the report's words."""
        if not self.pace_cpu_ms:
            return "a sleep: a GPU's step leaves the host's CPU free"
        return (
            f"{self.pace_cpu_ms:g} ms of it CPU work on the engine's thread, any rest a "
            "sleep; counted in that thread's CPU time, so other work on its core stretches "
            "the step as it would a CPU model's forward pass or a GPU engine core's "
            "scheduling and input preparation"
        )

    def stream_text(self) -> str:
        """What each stream asks beyond the parsed chat, in the report's words."""
        if self.top_logprobs is None:
            return ""
        return f"; each token's {self.top_logprobs} most likely alternatives with logprobs"


PLAIN = Load()
"""The parsed chat on a sleeping step: the load before these options."""
