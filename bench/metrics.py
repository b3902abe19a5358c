"""Reading the graph's ``/metrics``: what each engine holds."""

from __future__ import annotations

import re

# One line per Generate replica (deployments/vllm_adapter/engine_metrics.py): the requests
# its engine holds now, running or queued.
UNFINISHED = re.compile(
    r'^scaleout_engine_unfinished_requests\{replica="(?P<replica>[^"]*)"\} (?P<value>\S+)$'
)


def running_requests(metrics_text: str) -> dict[str, int]:
    """Requests each Generate replica's engine runs or queues, by replica id."""
    return {
        match["replica"]: int(float(match["value"]))
        for match in map(UNFINISHED.match, metrics_text.splitlines())
        if match
    }


# vLLM's histogram of tokens per engine step: its count is the engine's steps.
STEPS = re.compile(r"^vllm:iteration_tokens_total_count(?:\{[^}]*\})? (?P<value>\S+)$")


def engine_steps(metrics_text: str) -> float:
    """Engine steps so far, summed over every engine in the exposition."""
    return sum(
        float(match["value"]) for match in map(STEPS.match, metrics_text.splitlines()) if match
    )


# vLLM's own gauges of the requests its engine runs and queues.
VLLM_BUSY = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (?P<value>\S+)$")


def engine_busy(metrics_text: str) -> list[float]:
    """Requests each engine holds: the graph's gauge per Generate replica, or, on
    vLLM's own server (which has no such gauge), its running and waiting gauges."""
    graph = running_requests(metrics_text)
    if graph:
        return [float(v) for v in graph.values()]
    return [
        float(match["value"]) for match in map(VLLM_BUSY.match, metrics_text.splitlines()) if match
    ]
