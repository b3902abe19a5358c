"""CPU per output token: vLLM's own server against the graph, same paced load, one run.

    python -m bench.hostcpu --out docs/transport-benchmark.md

vLLM's coupled OpenAI server (``python -m vllm.entrypoints.openai.api_server``)
and then the graph (``serve run`` of one app, one Generate and one Derender
replica) serve the same model with the same parsers. Every engine step is held
``--pace-ms`` by the test logits processor (``bench/harness/paced_decode.py``,
a sleep: a GPU-like pace that costs no CPU). ``--streams`` chat streams of
``--tokens`` tokens each (``ignore_eos``) run at once against:

- ``vllm``: vLLM's server;
- ``tokens``: the graph's ``/inference/v1/generate``, token ids in and out
  (rendered once beforehand, so no Render work is counted);
- ``inline`` / ``tier``: the graph's ``/v1/chat/completions`` with text made
  next to the engine or in the Derender tier.

CPU is read from the process table before and after each load: for vLLM, its
server process and children (the engine core); for the graph, every process
under ``serve run`` (Ray's own included), and per tier the replica process
trees (``bench.observe``). ``--graph-env K=V`` sets environment variables on
``serve run`` (Ray's and Serve's switches reach every replica from there);
``--variant NAME:K=V,...`` runs the graph modes once more under other
switches, side by side in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.harness.pinning import add_vllm_engine_cores, bind_engine
from bench.harness.servers import (
    TINY_MODEL,
    Server,
    long_chat,
    running_graph,
    running_vllm_as_graph,
)
from bench.harness.sse_chunks import json_chunks
from bench.harness.variants import variant_pairs, with_collector
from bench.hostcpu.report import GRAPH_MODES, Result, report, row
from bench.metrics import engine_steps
from bench.observe import sample, tree_cpu_s

PACED = "bench.harness.paced_decode:PacedDecode"
PROMPTS = [
    "think: what is 2 plus 3?",
    "What is the weather in Paris?",
    "hello",
    "What is the capital of Japan?",
]
GRAPH_ARGS: dict[str, Any] = {
    "model": str(TINY_MODEL),
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "max_model_len": 4096,
    "kv_cache_gib": 2,
    "logits_processors": [PACED],
    "generate": {"num_replicas": 1},
    "derender": {"num_replicas": 1},
}
ENGINE_CORE = "EngineCore"  # vLLM titles its engine core process VLLM::EngineCore


# --traffic: "short", the four prompts above as the model's defaults sample them;
# "reasoning", every stream the reasoning prompt at temperature 1, so the parsers
# see long random reasoning; "reasoning-seeded", the same with a seed per request
# (the traffic of the benchmark in vLLM PR #58588).
TRAFFIC = ("short", "reasoning", "reasoning-seeded")
SEED_BASE = 1000


@dataclass
class Load:
    streams: int
    tokens: int
    pace_ms: float
    traffic: str = "short"

    def chat(self, i: int) -> dict[str, Any]:
        prompt = PROMPTS[i % len(PROMPTS)] if self.traffic == "short" else PROMPTS[0]
        body = long_chat(prompt, self.tokens, self.pace_ms)
        if self.traffic != "short":
            body["temperature"] = 1.0
        if self.traffic == "reasoning-seeded":
            body["seed"] = SEED_BASE + i
        return body


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid``'s process tree, and of the vLLM engine cores in it."""
    root = psutil.Process(pid)
    return tree_cpu_s(root), tree_cpu_s(root, only=ENGINE_CORE)


async def _chat_stream(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> int:
    """One streamed chat; its completion tokens, from the final usage chunk."""
    tokens = 0
    async for chunk in json_chunks(client, "/v1/chat/completions", body, headers):
        if chunk.get("usage"):
            tokens = int(chunk["usage"]["completion_tokens"])
    return tokens


async def _tokens_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> int:
    """One streamed ``/inference/v1/generate``; the token ids it returned."""
    tokens = 0
    async for chunk in json_chunks(client, "/inference/v1/generate", body, {}):
        tokens += sum(len(c.get("token_ids") or []) for c in chunk["choices"])
    return tokens


async def _rendered(client: httpx.AsyncClient, load: Load) -> list[dict[str, Any]]:
    """Generate bodies for the ``tokens`` mode, rendered by the graph before the clock."""
    bodies = []
    for i in range(load.streams):
        chat = {k: v for k, v in load.chat(i).items() if k not in ("stream", "stream_options")}
        reply = await client.post("/v1/chat/completions/render", json=chat)
        reply.raise_for_status()
        body = reply.json()
        body.pop("parse_context", None)
        body["request_id"] = f"hostcpu-{time.monotonic_ns()}-{i}"
        body["stream"] = True
        body["sampling_params"].update(
            max_tokens=load.tokens, ignore_eos=True, extra_args={"pace_ms": load.pace_ms}
        )
        bodies.append(body)
    return bodies


async def _run_load(base_url: str, load: Load, mode: str) -> tuple[int, float]:
    """``load`` against one server in one mode; (tokens delivered, wall seconds)."""
    limits = httpx.Limits(max_connections=load.streams + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        if mode == "tokens":
            bodies = await _rendered(client, load)
            start = time.perf_counter()
            counts = await asyncio.gather(*(_tokens_stream(client, b) for b in bodies))
        else:
            headers = {} if mode == "vllm" else {"X-Text-Placement": mode}
            start = time.perf_counter()
            counts = await asyncio.gather(
                *(_chat_stream(client, load.chat(i), headers) for i in range(load.streams))
            )
        wall = time.perf_counter() - start
    if list(counts) != [load.tokens] * load.streams:
        raise RuntimeError(f"{mode}: streams delivered {counts}, not {load.tokens} each")
    return sum(counts), wall


def measure(server: Server, load: Load, mode: str, port: int | None) -> Result:
    """Warm the path up, then run ``load`` once and read the CPU it took."""
    warm = Load(streams=min(4, load.streams), tokens=16, pace_ms=0, traffic=load.traffic)
    asyncio.run(_run_load(server.base_url, warm, mode))
    return measure_warm(server, load, mode, port)


def measure_warm(server: Server, load: Load, mode: str, port: int | None) -> Result:
    """Run ``load`` once on a warm path and read the CPU it took."""
    assert server.process is not None
    pid = server.process.pid
    before_tiers = sample(0, "default", port) if port is not None else None
    before, before_engine = cpu_s(pid)
    steps_before = _steps(server.base_url)
    tokens, wall = asyncio.run(_run_load(server.base_url, load, mode))
    after, after_engine = cpu_s(pid)
    steps = _steps(server.base_url) - steps_before
    tiers: dict[str, float] = {}
    if before_tiers is not None and port is not None:
        after_tiers = sample(0, "default", port)
        for process_id, (tier, value) in after_tiers.cpu_s.items():
            start = before_tiers.cpu_s.get(process_id, (tier, 0.0))[1]
            tiers[tier] = tiers.get(tier, 0.0) + value - start
    return Result(mode, tokens, wall, after - before, after_engine - before_engine, steps, tiers)


def _steps(base_url: str) -> float:
    """The engine steps taken so far by the server's engines (its ``/metrics``)."""
    return engine_steps(httpx.get(f"{base_url}/metrics", timeout=30).text)


@contextmanager
def vllm_server(work: Path, engine_cores: list[int] | None = None) -> Iterator[Server]:
    """vLLM's server; ``engine_cores``: its engine processes bound there once up, as a
    Generate replica binds its own."""
    with running_vllm_as_graph(
        work / "vllm.log", GRAPH_ARGS, extra_args=["--logits-processors", PACED]
    ) as server:
        if engine_cores is not None:
            bind_engine(server.process.pid, engine_cores)
        yield server


def measure_vllm(
    work: Path, load: Load, label: str, repeat: int, engine_cores: list[int] | None = None
) -> Result:
    with vllm_server(work, engine_cores) as server:
        runs = [measure(server, load, "vllm", None)]
        runs += [measure_warm(server, load, "vllm", None) for _ in range(repeat - 1)]
    result = combined(runs, label)
    print(row(result), flush=True)
    return result


def combined(results: list[Result], label: str) -> Result:
    """Several runs as one: CPU and tokens summed, wall averaged."""
    tiers: dict[str, float] = {}
    for r in results:
        for tier, cpu in r.tiers.items():
            tiers[tier] = tiers.get(tier, 0.0) + cpu
    return Result(
        mode=label,
        tokens=sum(r.tokens for r in results),
        wall_s=sum(r.wall_s for r in results) / len(results),
        cpu_s=sum(r.cpu_s for r in results),
        engine_core_s=sum(r.engine_core_s for r in results),
        steps=sum(r.steps for r in results),
        tiers=tiers,
    )


def run_graph_modes(
    work: Path,
    load: Load,
    env: dict[str, str],
    modes: list[str],
    label: str,
    repeat: int,
    graph_args: dict[str, str] | None = None,
) -> list[Result]:
    """Each mode warmed up, then ``repeat`` rounds of every mode in turn (so the
    host's drift over the run falls on all modes alike), summed per mode."""
    apps = {"default": ("/", {**GRAPH_ARGS, **(graph_args or {})})}
    graph_dir = work / f"graph-{label}"
    graph_dir.mkdir()
    runs: dict[str, list[Result]] = {mode: [] for mode in modes}
    with running_graph(graph_dir, apps, env=env) as server:
        port = int(server.base_url.rsplit(":", 1)[1])
        for round_ in range(repeat):
            for mode in modes:
                run = measure if round_ == 0 else measure_warm
                runs[mode].append(run(server, load, mode, port))
    results = []
    for mode, mode_runs in runs.items():
        results.append(combined(mode_runs, f"{label} {mode}" if label else mode))
        print(row(results[-1]), flush=True)
    return results


def _env_pairs(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per stream")
    parser.add_argument("--pace-ms", type=float, default=15, help="engine step (ms)")
    parser.add_argument("--traffic", choices=TRAFFIC, default="short", help="what the streams ask")
    parser.add_argument("--modes", default="vllm,tokens,inline,tier")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row, summed")
    parser.add_argument("--graph-env", default="", help="K=V,... set on `serve run` for the graph")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:K=V,... also run the graph modes with these (repeatable): upper-case "
        "keys are environment variables, lower-case ones graph args (observability.metrics)",
    )
    add_vllm_engine_cores(parser)
    parser.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    args = parser.parse_args()
    load = Load(args.streams, args.tokens, args.pace_ms, args.traffic)
    modes = args.modes.split(",")
    graph_modes = [m for m in modes if m in GRAPH_MODES]
    results: list[Result] = []
    with (
        tempfile.TemporaryDirectory(prefix="hostcpu-") as tmp,
        with_collector(args.variant) as traced,
    ):
        work = Path(tmp)
        runs: list[tuple[str, dict[str, str], dict[str, str]]] = [
            ("", _env_pairs(args.graph_env), {})
        ]
        for variant in traced.variants:
            name, _, pairs = variant.partition(":")
            env, graph_args = variant_pairs(pairs)
            runs.append((name, {**_env_pairs(args.graph_env), **env}, graph_args))
        # vLLM's server before and after the graph runs: the spread between the two
        # is this shared host's noise over the run; the targets use both together.
        references: list[Result] = []
        if "vllm" in modes:
            references.append(
                measure_vllm(work, load, "vllm, before", args.repeat, args.vllm_engine_cores)
            )
        for label, env, graph_args in runs:
            if graph_modes:
                results += run_graph_modes(
                    work, load, env, graph_modes, label, args.repeat, graph_args
                )
        if "vllm" in modes:
            references.append(
                measure_vllm(work, load, "vllm, after", args.repeat, args.vllm_engine_cores)
            )
            results = [*references, combined(references, "vllm"), *results]
    text = report(args, results, [label for label, _, _ in runs]) + "\n".join(traced.note())
    print(text)
    if args.out is not None:
        args.out.write_text(text)
