"""/metrics merges each engine's own vLLM registry into one exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from deployments.messages.control import EngineState
from deployments.vllm_adapter.engine_metrics import UNFINISHED, exposition, local_vllm_metrics


def engine_families(prompt_tokens: int, running: int) -> list[Metric]:
    """What one replica process sends: the vLLM families of its registry."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    counter = Counter("vllm:prompt_tokens", "Prompt tokens.", labels, registry=registry)
    counter.labels("m", "0").inc(prompt_tokens)
    gauge = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
    gauge.labels("m", "0").set(running)
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels, registry=registry)
    ttft.labels("m", "0").observe(0.2)
    Gauge("python_gc_objects", "Not the engine's.", registry=registry).set(7)
    return local_vllm_metrics(registry)


def merged() -> dict[str, list[tuple[str, dict[str, str], float]]]:
    states = [
        EngineState(replica="a", unfinished_requests=1, vllm_metrics=engine_families(3, 1)),
        EngineState(replica="b", unfinished_requests=0, vllm_metrics=engine_families(5, 0)),
    ]
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(exposition(states))
    }


def test_each_vllm_family_once_with_every_engines_samples_labelled_by_replica() -> None:
    families = merged()
    assert families["vllm:prompt_tokens"] == [
        ("vllm:prompt_tokens_total", {"model_name": "m", "engine": "0", "replica": "a"}, 3.0),
        ("vllm:prompt_tokens_total", {"model_name": "m", "engine": "0", "replica": "b"}, 5.0),
    ]
    assert [v for _, _, v in families["vllm:num_requests_running"]] == [1.0, 0.0]
    counts = [
        (labels["replica"], value)
        for name, labels, value in families["vllm:time_to_first_token_seconds"]
        if name.endswith("_count")
    ]
    assert counts == [("a", 1.0), ("b", 1.0)]


def test_only_vllm_families_leave_the_replica() -> None:
    assert [f.name for f in engine_families(1, 1)] == [
        "vllm:prompt_tokens",
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds",
    ]


def test_live_unfinished_gauge_per_engine_and_no_foreign_families() -> None:
    families = merged()
    assert families[UNFINISHED] == [
        (UNFINISHED, {"replica": "a"}, 1.0),
        (UNFINISHED, {"replica": "b"}, 0.0),
    ]
    assert not [name for name in families if name.startswith("python_")]


def test_no_engines_is_still_a_valid_exposition() -> None:
    text = exposition([])
    assert [f.name for f in text_string_to_metric_families(text)] == [UNFINISHED]
