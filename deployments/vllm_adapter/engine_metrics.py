"""The graph's ``/metrics``: every engine's vLLM metrics, told apart by replica, and
the graph's own (``observability/``).

Each Generate replica runs its engine in its own process, so each has its own
vLLM Prometheus registry. The ingress gathers their metric families (one
command down each replica's control channel per scrape; objects, not text to
parse again) and writes one exposition: vLLM's families once each, every
sample with a ``replica`` label, plus a gauge of the requests each engine holds
at the scrape (vLLM's own gauges are set as the engine steps).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deployments.messages.control import EngineState

UNFINISHED = "scaleout_engine_unfinished_requests"
VLLM_PREFIX = "vllm:"


def local_vllm_metrics(registry: CollectorRegistry = REGISTRY) -> list[Metric]:
    """This process's vLLM metric families (what vLLM's own ``/metrics`` writes),
    without the process's other collectors (``python_gc_*``, …)."""
    return [family for family in registry.collect() if family.name.startswith(VLLM_PREFIX)]


def exposition(states: Iterable[EngineState], graph: Iterable[Metric] = ()) -> str:
    """One Prometheus text exposition for every engine in ``states``, and the graph's
    own families (``observability/cluster_metrics.py``) after them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(states), list(graph)))
    return generate_latest(registry).decode()


class _Merged(Collector):
    def __init__(self, states: list[EngineState], graph: list[Metric]) -> None:
        self._states = states
        self._graph = graph

    def collect(self) -> Iterator[Metric]:
        unfinished = GaugeMetricFamily(
            UNFINISHED,
            "Requests each engine holds right now, running or queued.",
            labels=["replica"],
        )
        for state in self._states:
            unfinished.add_metric([state.replica], state.unfinished_requests)
        yield unfinished
        families: dict[str, Metric] = {}
        for state in self._states:
            for family in state.vllm_metrics:
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                merged.samples += [
                    s._replace(labels={**s.labels, "replica": state.replica})
                    for s in family.samples
                ]
        yield from families.values()
        yield from self._graph
