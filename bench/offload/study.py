"""Where the derender tier wins: text moved off an engine host whose CPU is short.

    python -m bench.offload --pace-cpu-ms 15 --streams 8,64,128,192 --out docs/offload.md

A local cluster shaped like ``k8s/overlays/cpu`` (``bench/harness/cluster.py``,
one node per group, no scaling) with each node on cores of its own
(``bench/harness/pinning.py``): the engine node's raylet and everything under it
(the Generate replica, vLLM's engine core and worker) on ``--engine-cores``; the
CPU node (Ingress, Render, Derender), the head (Serve's controller and HAProxy)
and this client on ``--text-cores``. Every process's cores are read back from
``/proc`` after the run and listed in the report; a process elsewhere fails it.

The engine's steps are held ``--pace-ms`` (``bench/harness/paced_decode.py``), a
sleep that leaves the host's CPU free as a GPU's step does, or with
``--pace-cpu-ms`` that much of it CPU work on the engine's thread: an engine that
needs its host's CPU every step, so that what limits decoding is the engine host's
CPU, not the model. ``--top-logprobs`` asks each token's logprobs too (more text
work per token). One deployment serves both placements, chosen per request
(``X-Text-Placement``): I, text made in the Generate replica on the engine's
core; S, in the Derender tier on the other. Each cell is
``N`` streamed chats at once (reasoning at temperature 1, a tool offered, so the
qwen3 reasoning and hermes tool parsers work on every token), I and S in turn,
``--rounds`` times each; CPU seconds of every cluster process are read before and
after each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import uvloop
import yaml

from bench.harness.cluster import (
    ClusterShape,
    LocalCluster,
    deploy_rayservice,
    local_cluster,
    set_client_env,
)
from bench.harness.host import host_line
from bench.harness.kustomize import overlay
from bench.harness.pinning import HEAD, by_group, cores_text, pin, placement
from bench.harness.servers import long_chat
from bench.harness.timed_stream import TimedStream, timed_chat
from bench.observe import REPLICA_TITLE
from bench.offload.load import PLAIN, Load
from bench.stats import percentile

PACED = "bench.harness.paced_decode:PacedDecode"
PROMPT = "think: what is 2 plus 3?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PLACEMENTS = ("inline", "tier", "auto")
DERENDER_STREAMS = 256
ENGINE_GROUP, TEXT_GROUP = "engine", "cpu-text"


def chat(tokens: int, pace_ms: float, load: Load = PLAIN) -> dict[str, Any]:
    body = long_chat(PROMPT, tokens, pace_ms, min(load.pace_cpu_ms, pace_ms))
    body.update(temperature=1.0, tools=TOOLS, tool_choice="auto")
    if load.top_logprobs is not None:
        body.update(logprobs=True, top_logprobs=load.top_logprobs)
    return body


def fixed_shape(rayservice: dict[str, Any]) -> ClusterShape:
    """The overlay's node groups, one node each and no more: what is measured is the
    placement of text, not the autoscaler."""
    shape = ClusterShape.of(rayservice)
    groups = tuple(replace(g, min_nodes=1, max_nodes=1) for g in shape.groups)
    return replace(shape, groups=groups)


def serve_config(rayservice: dict[str, Any], engine_cores: int) -> dict[str, Any]:
    """The overlay's ``serveConfigV2``, paced, with one replica per tier: Generate's
    engine threads bound to the engine node's cores."""
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    args = app["args"]
    args["logits_processors"] = [PACED]
    args["generate"]["cpu_cores"] = engine_cores
    for tier in ("render", "derender"):
        args[tier] = {"num_cpus": args[tier]["num_cpus"], "num_replicas": 1}
    # One Derender replica holds every stream of a cell, as one Generate replica does
    # (its 256): at its default 64, S would queue what I runs, and decode fewer at once.
    args["derender"]["max_ongoing_requests"] = DERENDER_STREAMS
    return config


@dataclass
class Round:
    layout: str
    """``disjoint``: the engine node on cores of its own; ``shared``: every process
    on every core."""
    pace_ms: float
    streams: int
    placement: str
    wall_s: float
    requests: list[dict[str, Any]]
    """Per stream: ttft_ms, tpot_ms, tokens, ok, error, placed (where the graph put it)."""
    cpu_s: dict[str, dict[str, float]]
    """Per node group (``engine``, ``cpu-text``, ``head``, ``client``): CPU seconds
    of each kind of process there (a replica by its deployment, vLLM's engine
    processes by title, the rest as ``other``)."""


@dataclass
class Study:
    host: dict[str, Any]
    args: dict[str, Any]
    rounds: list[Round] = field(default_factory=list)
    pinning: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per layout: every process and its cores, read back after the layout's rounds."""
    moving: list[dict[str, Any]] = field(default_factory=list)
    """The moving load's phases (``bench/offload/moving.py``)."""


def kind_of(title: str) -> str:
    replica = REPLICA_TITLE.search(title)  # Serve's replica titles, as bench.observe reads them
    if replica:
        return replica["deployment"]
    for marker, kind in (
        ("EngineCore", "EngineCore"),
        ("VLLM::Worker", "vLLM worker"),
        ("haproxy", "HAProxy"),
        ("ProxyActor", "proxy"),
        ("ServeController", "controller"),
    ):
        if marker in title:
            return kind
    return "other"


def cpu_snapshot(cluster: LocalCluster) -> dict[int, tuple[str, str, float]]:
    """Every cluster process: (node group, kind, its own CPU seconds)."""
    processes = cluster.processes()
    groups = by_group(processes)
    snapshot = {}
    for proc in processes:
        try:
            times = proc.cpu_times()
            title = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            continue
        snapshot[proc.pid] = (groups[proc.pid], kind_of(title), times.user + times.system)
    return snapshot


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_between(
    before: dict[int, tuple[str, str, float]], after: dict[int, tuple[str, str, float]]
) -> dict[str, dict[str, float]]:
    used: dict[str, dict[str, float]] = {}
    for pid, (group, kind, cpu) in after.items():
        start = before[pid][2] if pid in before else 0.0
        per_kind = used.setdefault(group, {})
        per_kind[kind] = round(per_kind.get(kind, 0.0) + cpu - start, 3)
    return used


async def one_round(
    base_url: str,
    streams: int,
    placement_: str,
    tokens: int,
    pace_ms: float,
    load: Load = PLAIN,
) -> tuple[float, list[TimedStream]]:
    headers = {"X-Text-Placement": placement_}
    url, body = f"{base_url}/v1/chat/completions", chat(tokens, pace_ms, load)
    start = time.monotonic()
    done = await asyncio.gather(*(timed_chat(url, body, headers) for _ in range(streams)))
    return time.monotonic() - start, list(done)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def measure(
    cluster: LocalCluster,
    base_url: str,
    cell: tuple[str, float, int],
    placement_: str,
    tokens: int,
    load: Load = PLAIN,
) -> Round:
    layout, pace_ms, streams = cell
    before, client_before = cpu_snapshot(cluster), client_cpu_s()
    wall, done = uvloop.run(one_round(base_url, streams, placement_, tokens, pace_ms, load))
    cpu = cpu_between(before, cpu_snapshot(cluster))
    cpu["client"] = {"client": round(client_cpu_s() - client_before, 3)}
    requests = [stream_record(s) for s in done]
    return Round(layout, pace_ms, streams, placement_, round(wall, 3), requests, cpu)


def stream_record(s: TimedStream) -> dict[str, Any]:
    return {"ttft_ms": _ms(s.ttft_ms), "tpot_ms": _ms(s.tpot_ms), "tokens": s.tokens,
            "ok": s.ok, "error": s.error, "placed": s.placed}  # fmt: skip


def layout_cores(layout: str, engine: set[int], text: set[int]) -> dict[str, set[int]]:
    if layout == "disjoint":
        return {HEAD: text, TEXT_GROUP: text, ENGINE_GROUP: engine}
    return {group: engine | text for group in (HEAD, TEXT_GROUP, ENGINE_GROUP)}


def run(args: argparse.Namespace, work: Path) -> Study:
    engine, text = set(args.engine_cores), set(args.text_cores)
    load = Load.of(args)
    set_client_env()
    rayservice = overlay("cpu")
    study = Study(
        host={"machine": platform.machine(), "cpus": psutil.cpu_count(), "line": host_line()},
        args={k: v for k, v in vars(args).items() if k not in ("out", "work", "report_only")},
    )
    # The cluster's own log goes beside Ray's, not into the results folder.
    logs = Path(tempfile.mkdtemp(prefix="offload-"))
    print(f"cluster log: {logs / 'cluster.log'}", flush=True)
    with local_cluster(fixed_shape(rayservice), logs) as cluster:
        # Pinned before the deploy: the replicas Ray starts on a node inherit its cores.
        pin(cluster.processes(), layout_cores(args.layouts[0], engine, text))
        spec = {**rayservice["spec"], "serveConfigV2": yaml.safe_dump(
            serve_config(rayservice, len(engine)))}  # fmt: skip
        base_url = deploy_rayservice(cluster, {**rayservice, "spec": spec})
        for layout in args.layouts:
            cores = layout_cores(layout, engine, text)
            pin(cluster.processes(), cores)
            # This client runs where the head does: never on the engine's own cores.
            os.sched_setaffinity(0, cores[HEAD])
            for placement_ in PLACEMENTS:  # warm every path (auto: its load reading)
                uvloop.run(one_round(base_url, 4, placement_, 16, 0, load))
            for pace in args.pace_ms:
                for streams in args.streams:
                    for round_ in range(args.rounds):
                        # Each placement first, between and last in turn.
                        turn = round_ % len(PLACEMENTS)
                        order = PLACEMENTS[turn:] + PLACEMENTS[:turn]
                        for placement_ in order:
                            cell = (layout, pace, streams)
                            measured = measure(
                                cluster, base_url, cell, placement_, args.tokens, load
                            )
                            study.rounds.append(measured)
                            print(summary(measured), flush=True)
            study.pinning[layout] = [asdict(p) for p in placement(cluster.processes())]
            check_pinning(study.pinning[layout], cores)
        if args.moving:
            from bench.offload.moving import moving_load  # it builds on this module

            study.moving = moving_load(cluster, base_url, args, engine, text)
    return study


def check_pinning(pinning: list[dict[str, Any]], cores: dict[str, set[int]]) -> None:
    """Every process on its group's cores, read back from the kernel."""
    wrong = [p for p in pinning if p["cores"] != cores_text(cores[p["group"]])]
    if wrong:
        raise RuntimeError(f"processes off their cores: {wrong[:5]}")


def summary(r: Round) -> str:
    ok = [q for q in r.requests if q["ok"]]
    errors = Counter(q["error"] for q in r.requests if not q["ok"])
    p50 = percentile([q["tpot_ms"] for q in ok if q["tpot_ms"] is not None], 50) or float("nan")
    cores = {g: round(sum(k.values()) / r.wall_s, 2) for g, k in r.cpu_s.items()}
    return (
        f"{r.layout}, step {r.pace_ms:g} ms, N={r.streams} {r.placement}: "
        f"{len(ok)}/{len(r.requests)} ok, TPOT p50 {p50:.1f} ms, wall {r.wall_s:.1f} s, "
        f"cores {cores}" + (f", errors {dict(errors)}" if errors else "")
    )


def main() -> None:
    from bench.offload.report import write_report

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")],
                        default=[4, 16, 48])  # fmt: skip
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per stream")
    parser.add_argument("--pace-cpu-ms", type=float, default=0.0,
                        help="of each step, CPU work on the engine's thread (ms)")  # fmt: skip
    parser.add_argument("--top-logprobs", type=int, default=None,
                        help="ask each token's logprobs with this many alternatives")  # fmt: skip
    parser.add_argument("--pace-ms", type=lambda s: [float(x) for x in s.split(",")],
                        default=[15.0], help="engine steps (ms)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="rounds of I, S, A per cell")
    parser.add_argument("--moving", type=lambda s: s.split(",") if s else [],
                        default=["shared", "disjoint", "shared"],
                        help="the moving load's phases, by layout ('' for none)")  # fmt: skip
    parser.add_argument("--moving-streams", type=int, default=64)
    parser.add_argument("--moving-tokens", type=int, default=128)
    parser.add_argument("--phase-s", type=float, default=25.0, help="each moving phase")
    parser.add_argument("--layouts", type=lambda s: s.split(","), default=["disjoint", "shared"],
                        help="disjoint: the engine on cores of its own; shared: all on all",
                        )  # fmt: skip
    parser.add_argument("--engine-cores", type=lambda s: [int(x) for x in s.split(",")],
                        default=[0])  # fmt: skip
    parser.add_argument("--text-cores", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1])  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("docs/offload.md"))
    parser.add_argument("--work", type=Path, default=None,
                        help="results.json here (default: --out less .md)")  # fmt: skip
    parser.add_argument("--report-only", action="store_true", help="re-write from --work")
    args = parser.parse_args()
    work = args.work or args.out.with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    results = work / "results.json"
    if not args.report_only:
        study = run(args, work)
        results.write_text(json.dumps(asdict(study), separators=(",", ":")))
    write_report(json.loads(results.read_text()), args.out)
    print(f"wrote {args.out} (results: {results})")
