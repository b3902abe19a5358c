"""The Ray Serve switches the graph runs with, in every Ray process's environment.

Serve reads them when each of its processes starts (controller, proxy,
replicas), so they cannot ride in a Serve config: ``make run`` exports them,
the KubeRay manifests set them on every pod, and the tests and benchmarks
start their graphs with them. One place, so all of those run the same graph.

``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (Ray 2.60): user code and the handle's
router on the replica's own event loop rather than a second thread and loop,
replica-to-replica calls over Serve's gRPC data plane (by value, not through
the object store), buffered request logs, direct ingress. Measured with
``python -m bench.hostcpu`` (docs/transport-benchmark.md): it takes the
graph's CPU per token with tier text from 1.69× vLLM's own server to 1.10×.
"""

from __future__ import annotations

SERVE_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
