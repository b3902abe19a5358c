"""What one observation of the graph's metrics costs, measured where it is paid: in a
Serve replica, through ``graph_metrics()`` (Ray Serve's histogram, Ray's recorder).

A one-replica Serve app on a local Ray instance of its own (start it with no other
Ray running) times ``rounds`` loops of ``n`` observations of
``ray_scaleout_inter_item_seconds`` and answers each loop's microseconds per
observation."""

from __future__ import annotations

import time

import ray
from ray import serve

from deployments.observability.metrics import graph_metrics


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class ObserveCost:
    def __call__(self, n: int, rounds: int) -> list[float]:
        histogram = graph_metrics().inter_item_seconds
        histogram.observe(0.001)  # made, and Ray's recorder set up, before timing
        per_round = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(n):
                histogram.observe(0.012)
            per_round.append((time.perf_counter() - start) / n * 1e6)
        return per_round


def observe_cost_us(n: int = 20000, rounds: int = 5) -> list[float]:
    """Microseconds per observation, one figure per round."""
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        app = ObserveCost.bind()  # type: ignore[attr-defined]
        handle = serve.run(app, name="observe-cost", route_prefix=None)
        result: list[float] = handle.remote(n, rounds).result()
        return result
    finally:
        serve.shutdown()
        ray.shutdown()
