"""The Ray and Ray Serve switches the graph runs with, in every Ray process's environment.

Ray and Serve read them when each of their processes starts (raylet,
controller, proxy, replicas), so they cannot ride in a Serve config: ``make run`` exports them,
the KubeRay manifests set them on every pod, and the tests and benchmarks
start their graphs with them. One place, so all of those run the same graph.

``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (Ray 2.60): user code and the handle's
router on the replica's own event loop rather than a second thread and loop,
replica-to-replica calls over Serve's gRPC data plane (by value, not through
the object store), buffered request logs. Measured with
``python -m bench.hostcpu`` (docs/transport-benchmark.md): it took the
graph's CPU per token with tier text from 1.89× vLLM's own server to 1.33×.
"""

from __future__ import annotations

SERVE_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # Direct ingress (on with the above) gives each Ingress replica its own HTTP port
    # for an HAProxy in front; clients here and on KubeRay reach the graph through
    # Serve's proxy, which stays in the path either way. It also holds every Ingress
    # replica's shutdown for at least 35 s (its minimum draining period): a Ctrl-C
    # of `make run`, a redeploy or a scale-in would wait that long for nothing.
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
    # Replica logs stay on stderr (off with the above), so they reach `serve run`'s
    # output and `kubectl logs` as before: a replica that exits says why there.
    # Serve writes a line per request, not per token.
    "RAY_SERVE_LOG_TO_STDERR": "1",
    # A Generate replica's vLLM engine is its child process and survives the replica's
    # crash or SIGKILL (vLLM does not watch its parent), holding its KV cache and cores.
    # With this, the raylet adopts a dead worker's children and kills them within 10 s
    # (Ray's default only covers a worker that exits cleanly).
    "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
    # Serve's gRPC data plane takes messages up to 4 MiB by default, below the 32 MiB
    # bodies the Ingress accepts and the answers they get (a long unary answer with
    # logprobs): past it a call fails with no retry that could succeed. Without this
    # switch, the Ingress caps bodies at half of Serve's limit (ingress.py).
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(256 * 2**20),
    # Middleware in Serve's HTTP proxy (deployments/edge/proxy_middleware.py): uuid4 request ids
    # where the client sent none (Serve's own are predictable), and header values
    # that are not UTF-8 served rather than a 500 from the proxy.
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "deployments.edge.proxy_middleware:middlewares",
}
