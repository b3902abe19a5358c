"""CPU per request, request rate and TTFT: vLLM's server against the graph, one run.

    python -m bench.requests --out docs/request-overhead.md

The load is short streamed chats (``--tokens`` each, temperature 0) in a
closed loop at each ``--concurrency``, ``--requests`` per cell after a warm-up
(``bench/requests/load.py``). The servers, each started, measured and stopped
in turn, serve the embedded model with the same parsers:

- ``vllm``: ``python -m vllm.entrypoints.openai.api_server``;
- ``plain``: ``serve run graph:app`` with none of the graph's Serve switches
  in the environment (the command the README documents first);
- ``make-run``: the same with the switches ``make run`` exports;
- ``--variant NAME:K=V,...``: ``make-run`` with more variables (e.g. Serve's
  HAProxy ingress, ``RAY_SERVE_ENABLE_HA_PROXY=1``);
- ``floor``: ``serve run bench.requests.floor_app:app`` with ``make run``'s switches,
  the graph's hops with no vLLM and no text work (``bench/requests/floor_app.py``):
  what Serve and Ray alone take per request of the graph's shape;
- ``floor-min``: the same at its least (``FLOOR_MIN_ENV``): a stream in two items, and
  a request as short as vLLM's;
- ``floor-engine``: ``floor-min`` with vLLM's engine behind its Generate
  (``FLOOR_ENGINE_ENV``): the graph's hops and engine with none of its serving work.

Every graph serves both text placements (``X-Text-Placement: inline`` and
``tier``). By default vLLM's server stays up beside each graph, and each
round alternates their cells (vLLM's, then the graph's inline and tier, the
order reversed every other round), with the server not measured stopped
(``bench/harness/freeze.py``): this shared host's speed drifts 2-3x within an
hour, and a ratio is then taken between cells seconds apart, round by round,
not between two servers' hours. ``--in-turn`` measures each server alone, one
after another, as earlier runs did. The report quotes the median and the
spread. CPU is every process of the server's tree, by kind
(``bench/requests/processes.py``); idle CPU is read over ``--idle-s`` seconds
after the warm-up, and memory (RSS, USS) per kind then.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.harness.freeze import frozen
from bench.harness.pinning import add_vllm_engine_cores, bind_engine
from bench.harness.servers import (
    SERVE_RUN_STOP_GRACE_S,
    VENV_BIN,
    Server,
    haproxy_side_ports,
    port_is_free,
    running,
    running_vllm,
)
from bench.harness.variants import variant_pairs, with_collector
from bench.requests import engine_view
from bench.requests.load import ShortChats, closed_loop
from bench.requests.processes import Memory, cpu_by_kind, memory_by_kind, snapshot
from bench.requests.report import report
from deployments.config.graph_config import EMBEDDED_DEFAULT, TINY_MODEL
from deployments.config.serve_env import SERVE_ENV

SERVE_PORT = 8000  # `serve run graph:app` takes Serve's default; the import path has no flag
GRAPH_MODES = ("inline", "tier")
KV_CACHE_GIB = 2  # GraphConfig's default, given to vLLM's server too
FLOOR_APP = "bench.requests.floor_app:app"
# floor_app's switches for its least floor: a stream in two items, an engine step of
# 1.25 ms (vLLM's engine made about 690 steps a second at concurrency 1 on this host).
FLOOR_MIN_ENV = {"FLOOR_ITEMS": "joined", "FLOOR_STEP_MS": "1.25"}
# ... and with vLLM's engine behind its Generate, pacing the stream with real steps.
FLOOR_ENGINE_ENV = {**FLOOR_MIN_ENV, "FLOOR_ENGINE": "vllm"}
# Each floor by its --servers name, with its switches.
FLOORS = {"floor": {}, "floor-min": FLOOR_MIN_ENV, "floor-engine": FLOOR_ENGINE_ENV}
MAX_MODEL_LEN = 32768  # the embedded model's, the graph's default


@dataclass
class Cell:
    server: str
    mode: str
    concurrency: int
    round: int
    requests: int
    wall_s: float
    ttft_ms: list[float]
    e2e_ms: list[float]
    cpu_s: dict[str, float]
    engine: dict[str, float] = field(default_factory=dict)
    """What vLLM's metrics counted over the cell (``engine_view.py``); empty without."""


@dataclass
class ServerRun:
    label: str
    command: str
    cells: list[Cell] = field(default_factory=list)
    idle_core_share: dict[str, float] = field(default_factory=dict)
    """CPU per kind while idle, as a share of one core."""
    memory: dict[str, Memory] = field(default_factory=dict)


def requests_vllm(log_path: Path, extra_args: Sequence[str] = ()) -> AbstractContextManager[Server]:
    """vLLM's server as every ``bench.requests`` study runs it: the embedded model with
    the graph's parsers, context and cache."""
    return running_vllm(
        log_path,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_gib=KV_CACHE_GIB,
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        extra_args=extra_args,
    )


def measure_cell(
    server: Server,
    label: str,
    load: ShortChats,
    mode: str,
    concurrency: int,
    requests: int,
    round_: int = 0,
) -> Cell:
    """One closed-loop cell against a running server, its CPU read around it."""
    headers = {} if mode == "vllm" else {"X-Text-Placement": mode}
    # Read outside the CPU window: a scrape of the graph's /metrics crosses replicas.
    engine_before = engine_view.read_totals(server.base_url)
    before = snapshot(server.process.pid)
    timings, wall = asyncio.run(closed_loop(server.base_url, load, concurrency, requests, headers))
    after = snapshot(server.process.pid)
    engine = engine_view.delta(engine_before, engine_view.read_totals(server.base_url))
    return Cell(
        server=label,
        mode=mode,
        concurrency=concurrency,
        round=round_,
        requests=len(timings),
        wall_s=wall,
        ttft_ms=[t.ttft_s * 1000 for t in timings],
        e2e_ms=[t.e2e_s * 1000 for t in timings],
        cpu_s=cpu_by_kind(before, after),
        engine=engine,
    )


def measure_idle(server: Server, idle_s: float) -> tuple[dict[str, float], dict[str, Memory]]:
    """CPU per kind (share of one core) over ``idle_s`` of no traffic, then memory."""
    time.sleep(5)  # let the warm-up's last work (metrics pushes, logs) drain
    before = snapshot(server.process.pid)
    time.sleep(idle_s)
    after = snapshot(server.process.pid)
    share = {kind: cpu / idle_s for kind, cpu in cpu_by_kind(before, after).items()}
    return share, memory_by_kind(snapshot(server.process.pid, memory=True))


def measure_paired(
    vllm: Server,
    vllm_run: ServerRun,
    graph: Server,
    graph_run: ServerRun,
    args: argparse.Namespace,
    first_round: int,
) -> None:
    """vLLM's server and a graph, both up, measured cell by cell in turn, the other
    stopped; rounds numbered from ``first_round`` in both runs, so that the report
    pairs each graph round with the vLLM cells next to it."""
    load = ShortChats(model=str(TINY_MODEL), tokens=args.tokens)
    sides = {"vllm": (vllm, vllm_run, graph)}
    sides.update({mode: (graph, graph_run, vllm) for mode in GRAPH_MODES})
    for mode, (server, _, other) in sides.items():
        with frozen(other):
            measure_cell(server, "warm-up", load, mode, 4, 16)  # not kept
    if not vllm_run.idle_core_share:
        with frozen(graph):
            vllm_run.idle_core_share, vllm_run.memory = measure_idle(vllm, args.idle_s)
    with frozen(vllm):
        graph_run.idle_core_share, graph_run.memory = measure_idle(graph, args.idle_s)
    for round_ in range(first_round, first_round + args.repeat):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for concurrency in args.concurrency:
            for mode in order:
                server, run, other = sides[mode]
                with frozen(other):
                    cell = measure_cell(
                        server, run.label, load, mode, concurrency, args.requests, round_
                    )
                record_cell(run, cell)


def record_cell(run: ServerRun, cell: Cell) -> None:
    run.cells.append(cell)
    cpu_ms = sum(cell.cpu_s.values()) / cell.requests * 1000
    print(
        f"{run.label} {cell.mode} c={cell.concurrency} round {cell.round}: "
        f"{cell.requests / cell.wall_s:.1f} req/s, {cpu_ms:.0f} CPU ms/request",
        flush=True,
    )


def measure_server(
    server: Server, run: ServerRun, modes: list[str], args: argparse.Namespace
) -> None:
    load = ShortChats(model=str(TINY_MODEL), tokens=args.tokens)
    for mode in modes:
        measure_cell(server, run.label, load, mode, 4, 16)  # warm-up, not kept
    run.idle_core_share, run.memory = measure_idle(server, args.idle_s)
    for round_ in range(args.repeat):
        for concurrency in args.concurrency:
            for mode in modes:
                cell = measure_cell(
                    server, run.label, load, mode, concurrency, args.requests, round_
                )
                record_cell(run, cell)


@contextmanager
def graph_server(
    work: Path,
    env: dict[str, str],
    unset: list[str],
    target: str = "graph:app",
    graph_args: dict[str, str] | None = None,
) -> Iterator[Server]:
    """``serve run target``; with ``graph_args``, ``serve run graph:build_app`` with
    them over ``graph:app``'s own (``EMBEDDED_DEFAULT``)."""
    command = [target]
    if graph_args:
        args = {**EMBEDDED_DEFAULT, **graph_args}
        command = ["graph:build_app", *(f"{key}={value}" for key, value in args.items())]
    if not port_is_free(SERVE_PORT):
        raise SystemExit(f"port {SERVE_PORT} is taken; `serve run {target}` needs it")
    with running(
        [str(VENV_BIN / "serve"), "run", *command],
        port=SERVE_PORT,
        log_path=work / "serve.log",
        env={"RAY_USAGE_STATS_ENABLED": "0", **haproxy_side_ports(), **env},
        unset=unset,
        stop_grace_s=SERVE_RUN_STOP_GRACE_S,
    ) as server:
        yield server


def floor_command(floor_env: dict[str, str]) -> str:
    """How a floor with these switches is started, as the reports name it."""
    command = f"serve run {FLOOR_APP}, make run's switches exported"
    named = " ".join(f"{k}={v}" for k, v in floor_env.items())
    return f"{command}, with {named}" if named else command


@contextlib.contextmanager
def floor_server(work: Path, floor_env: dict[str, str]) -> Iterator[Server]:
    """``serve run`` of the floor app with ``make run``'s switches and ``floor_env``."""
    with graph_server(work, {**SERVE_ENV, **floor_env}, [], FLOOR_APP) as server:
        yield server


GraphVariant = tuple[str, dict[str, str], list[str], dict[str, str]]


def graph_variants(variants: list[str]) -> list[GraphVariant]:
    """(label, environment, names unset, graph args) of each graph to run."""
    runs: list[GraphVariant] = [
        ("plain", {}, list(SERVE_ENV), {}),
        ("make-run", dict(SERVE_ENV), [], {}),
    ]
    for variant in variants:
        name, _, pairs = variant.partition(":")
        env, graph_args = variant_pairs(pairs)
        runs.append((name, {**SERVE_ENV, **env}, [], graph_args))
    return runs


def _graph_command(label: str, env: dict[str, str], graph_args: dict[str, str]) -> str:
    extra = " ".join(f"{k}={v}" for k, v in env.items() if SERVE_ENV.get(k) != v)
    command = "serve run graph:app"
    if graph_args:
        command = "serve run graph:build_app " + " ".join(
            f"{k}={v}" for k, v in {**EMBEDDED_DEFAULT, **graph_args}.items()
        )
    command += f" ({extra})" if extra else ""
    if label == "make-run":
        command += ", make run's switches exported"
    return command


def add_load_options(parser: argparse.ArgumentParser, *, requests: int) -> None:
    """The closed-loop short-chat load's options (``ShortChats``, ``closed_loop``), for
    every bench that runs it."""
    parser.add_argument("--tokens", type=int, default=8, help="output tokens per chat")
    parser.add_argument("--requests", type=int, default=requests, help="requests per cell")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 16]
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every cell")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_load_options(parser, requests=100)
    parser.add_argument("--idle-s", type=float, default=30)
    parser.add_argument("--servers", default="vllm,plain,make-run", help="which to run, in order")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:K=V,... a graph as make-run with these too (repeatable): upper-case "
        "keys are environment variables, lower-case ones graph args (observability.metrics)",
    )
    parser.add_argument(
        "--in-turn",
        action="store_true",
        help="each server alone, one after another, not side by side in alternating cells",
    )
    add_vllm_engine_cores(parser)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    parser.add_argument("--json", type=Path, default=None, help="write every cell here")
    args = parser.parse_args()
    chosen = args.servers.split(",") + [v.partition(":")[0] for v in args.variant]
    runs: list[ServerRun] = []
    with (
        tempfile.TemporaryDirectory(prefix="requests-") as tmp,
        with_collector(args.variant) as traced,
        contextlib.ExitStack() as vllm_up,
    ):
        work = Path(tmp)
        vllm: tuple[Server, ServerRun] | None = None
        if "vllm" in chosen:
            run = ServerRun("vllm", "python -m vllm.entrypoints.openai.api_server")
            server = vllm_up.enter_context(requests_vllm(work / "vllm.log"))
            if args.vllm_engine_cores is not None:
                bound = bind_engine(server.process.pid, args.vllm_engine_cores)
                run.command += (
                    f", its {bound} engine processes bound to core(s) "
                    f"{','.join(map(str, args.vllm_engine_cores))} once up"
                )
            runs.append(run)
            if args.in_turn:
                measure_server(server, run, ["vllm"], args)
                vllm_up.close()
            else:
                vllm = (server, run)
        graphs = [
            (label, env, unset, graph_args, "graph:app", _graph_command(label, env, graph_args))
            for label, env, unset, graph_args in graph_variants(traced.variants)
            if label in chosen
        ]
        for label, floor_env in FLOORS.items():
            if label in chosen:
                env = {**SERVE_ENV, **floor_env}
                graphs.append((label, env, [], {}, FLOOR_APP, floor_command(floor_env)))
        for turn, (label, env, unset, graph_args, target, command) in enumerate(graphs):
            run = ServerRun(label, command)
            graph_dir = work / label
            graph_dir.mkdir()
            with graph_server(graph_dir, env, unset, target, graph_args) as server:
                if vllm is None:
                    measure_server(server, run, list(GRAPH_MODES), args)
                else:
                    measure_paired(*vllm, server, run, args, first_round=turn * args.repeat)
            runs.append(run)
    text = report(args, runs) + "\n".join(traced.note())
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
