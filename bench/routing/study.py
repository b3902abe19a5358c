"""Prefix routing against power of two choices, with two Generate replicas.

    python -m bench.routing --out docs/routing.md

One ``serve run`` of three apps side by side, each topology I's (inline text,
so ``X-Served-By`` names the Generate replica of each request): one Generate
replica; two with ``generate.routing=pow2``; two with ``generate.routing=prefix``.
Only one app has load at a time; each pass runs on every app in turn, the order
reversed on every other pass, so a host whose speed drifts favours none. Each
app serves the same seeded requests:

- **shared**: ``--conversations`` conversations, each over a system prompt of
  its own (``--system-words`` words, ~5 tokens each with the embedded
  model), ``--turns`` turns each. Conversations start open-loop (Poisson,
  ``--start-rps``); a conversation's next turn goes out after its answer and
  an exponential think time (``--think-s``), so turns of different
  conversations interleave.
- **unique** (two-replica graphs): ``--unique`` one-turn requests, each with a
  system prompt of its own, Poisson at ``--unique-rps``: nothing to gain from
  prefixes, so prefix routing must not pile them onto one replica.

Per workload: the prefix-cache hit rate (the engines' own
``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` on ``/metrics``,
summed, before and after), TTFT (client, to the first chunk with output),
and the requests each replica served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench import prefill_model
from bench.cli import reproducing_command
from bench.clients import carries_output
from bench.harness.servers import running_graph
from bench.routing.report import write
from bench.routing.results import Result, Turn
from bench.topology import CONFIGS
from deployments.config.graph_config import TINY_MODEL, nest_dotted
from deployments.config.topologies import app_config

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "sigma", "omega"]
INLINE = {"X-Text-Placement": "inline"}
PREFIX_COUNTER = re.compile(
    r"^vllm:prefix_cache_(?P<kind>hits|queries)_total(?:\{[^}]*\})? (?P<value>\S+)$"
)
# Row group → (Generate replicas, graph args over topology I's).
VARIANTS: dict[str, tuple[int, dict[str, Any]]] = {
    "1 replica": (1, {"generate.routing": "pow2"}),
    "pow2": (2, {"generate.routing": "pow2"}),
    "prefix": (2, {"generate.routing": "prefix"}),
    "prefix/history": (
        2,
        {"generate.routing": "prefix", "generate.prefix_routing.engine_events": False},
    ),
}
DEFAULT_RUNS = "1 replica,pow2,prefix"


def prefix_counters(metrics: str) -> tuple[float, float]:
    totals = {"hits": 0.0, "queries": 0.0}
    for match in map(PREFIX_COUNTER.match, metrics.splitlines()):
        if match:
            totals[match["kind"]] += float(match["value"])
    return totals["hits"], totals["queries"]


def system_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def ask(
    http: httpx.AsyncClient, messages: list[dict[str, Any]], args: Any, turn: Turn
) -> str:
    body = {
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.monotonic()
    text: list[str] = []
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=INLINE) as reply:
            if reply.status_code != 200:
                turn.error = f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}"
                return ""
            turn.replica = reply.headers.get("X-Served-By")
            async for line in reply.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    turn.error = str(chunk["error"].get("message"))
                    return ""
                for choice in chunk.get("choices") or []:
                    if carries_output(choice) and turn.ttft_ms is None:
                        turn.ttft_ms = (time.monotonic() - started) * 1000
                    text.append((choice.get("delta") or {}).get("content") or "")
    except httpx.HTTPError as exc:
        turn.error = f"{type(exc).__name__}: {exc}"
    return "".join(text) or "ok"


async def conversation(
    http: httpx.AsyncClient, index: int, start_s: float, args: Any, result: Result, clock: Any
) -> None:
    rng = random.Random(args.seed * 1000 + index)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"{index} {system_prompt(rng, args.system_words)}"}
    ]
    await asyncio.sleep(max(0.0, start_s - clock()))
    for number in range(args.turns):
        question = " ".join(rng.choice(WORDS) for _ in range(10))
        messages.append({"role": "user", "content": question})
        turn = Turn(index, number, clock())
        result.turns.append(turn)
        answer = await ask(http, messages, args, turn)
        if turn.error:
            return
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(rng.expovariate(1 / args.think_s))


def poisson_starts(count: int, rps: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rps)
    return out


async def workload(base_url: str, result: Result, repeat: int, args: Any) -> None:
    """One pass of ``result.workload``; repeat ``k`` has prompts of its own (seeded)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        hits0, queries0 = prefix_counters((await http.get("/metrics")).text)
        start = time.monotonic()
        clock = lambda: time.monotonic() - start  # noqa: E731
        base = 100_000 * (repeat + 1)
        if result.workload == "shared":
            starts = poisson_starts(args.conversations, args.start_rps, args.seed + repeat)
            jobs = [
                conversation(http, base + i, s, args, result, clock) for i, s in enumerate(starts)
            ]
        else:  # unique: one turn each, every prompt its own
            starts = poisson_starts(args.unique, args.unique_rps, args.seed + 50 + repeat)
            one_turn = argparse.Namespace(**{**vars(args), "turns": 1})
            jobs = [
                conversation(http, base + 50_000 + i, s, one_turn, result, clock)
                for i, s in enumerate(starts)
            ]
        await asyncio.gather(*jobs)
        result.wall_s += clock()
        hits1, queries1 = prefix_counters((await http.get("/metrics")).text)
    result.hits += hits1 - hits0
    result.queries += queries1 - queries0


async def warm(base_url: str, args: Any) -> None:
    """Short and full-length prompts, several at once, so that every engine has
    compiled its prefill shapes before anything is measured."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        jobs = []
        for words in (20, args.system_words):
            warm_args = argparse.Namespace(**{**vars(args), "max_tokens": 4})
            for i in range(8):
                rng = random.Random(-1 - i)
                messages = [
                    {"role": "system", "content": f"warm {words} {i} {system_prompt(rng, words)}"},
                    {"role": "user", "content": "hi"},
                ]
                jobs.append(ask(http, messages, warm_args, Turn(-1, 0, 0.0)))
        await asyncio.gather(*jobs)


def graph_apps(
    runs: list[str], cpu_cores: int | None = None, model: str | None = None
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Topology I's app once per row group, side by side in one Serve instance."""
    base = app_config(CONFIGS / "I.yaml")["args"]
    apps = {}
    for run in runs:
        replicas, variant = VARIANTS[run]
        args = {
            **base,
            # Five engines and three apps on one small host: small caches (1 GiB holds
            # ~2M tokens of the embedded model) and logical CPUs that all fit.
            "kv_cache_gib": 1,
            "ingress.num_cpus": 0.05,
            "render.num_cpus": 0.05,
            "derender.num_cpus": 0.05,
            "generate.num_cpus": 0.2,
            "generate.num_replicas": replicas,
            # Unbound unless asked: past the host's free cores, engines of several
            # apps, each its own deployment's rank 0, would share one core.
            "generate.cpu_cores": cpu_cores or "off",
            **({"model": model} if model else {}),
            **variant,
        }
        apps[_slug(run)] = (f"/{_slug(run)}", nest_dotted(args))
    return apps


def _slug(run: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", run)


def run_all(args: Any, work: Path) -> list[Result]:
    """Every pass on every app of one graph, the order reversed on every other repeat
    so that no app always runs first or last on a host whose speed drifts."""
    work.mkdir(parents=True, exist_ok=True)
    runs = args.runs.split(",")
    results = {run: (Result(run, "shared"), Result(run, "unique")) for run in runs}
    model = None if args.model == str(TINY_MODEL) else args.model
    apps = graph_apps(runs, args.cpu_cores, model)
    with running_graph(work, apps, timeout_s=900) as server:
        for run in runs:
            asyncio.run(warm(f"{server.base_url}/{_slug(run)}", args))
        for repeat in range(args.repeat):
            for run in runs if repeat % 2 == 0 else runs[::-1]:
                replicas = VARIANTS[run][0]
                base_url = f"{server.base_url}/{_slug(run)}"
                shared, unique = results[run]
                asyncio.run(workload(base_url, shared, repeat, args))
                if replicas > 1:
                    asyncio.run(workload(base_url, unique, repeat, args))
                print(f"pass {repeat}: {run} done", flush=True)
    return [r for run in runs for r in results[run][: 2 if VARIANTS[run][0] > 1 else 1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=600)
    parser.add_argument("--start-rps", type=float, default=0.5)
    parser.add_argument("--think-s", type=float, default=2.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--unique", type=int, default=48)
    parser.add_argument("--unique-rps", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cpu-cores",
        type=int,
        default=None,
        help="generate.cpu_cores: each engine bound to cores of its own (default: unbound)",
    )
    parser.add_argument("--repeat", type=int, default=2, help="passes of each workload per graph")
    parser.add_argument("--model", default=str(TINY_MODEL))
    parser.add_argument(
        "--prefill-heavy",
        action="store_true",
        help="serve bench.prefill_model's model (8x the embedded model's weights per token)",
    )
    parser.add_argument(
        "--runs", default=DEFAULT_RUNS, help=f"row groups, of: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-routing"))
    parser.add_argument("--out", type=Path, default=Path("docs/routing.md"))
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite --out from --work's results.json"
    )
    args = parser.parse_args()
    args.host = f"{platform.machine()}, {os.cpu_count()} CPUs"
    if args.prefill_heavy:
        args.model = str(prefill_model.build(args.work / "prefill-heavy"))
    saved = args.work / "results.json"
    if args.report_only:
        results = [
            Result(**{**r, "turns": [Turn(**t) for t in r["turns"]]})
            for r in json.loads(saved.read_text())
        ]
    else:
        results = run_all(args, args.work)
        args.work.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps([asdict(r) for r in results], indent=1))
    command = reproducing_command(
        "bench.routing", parser, args, skip=("work", "out", "model", "report_only")
    )
    write(results, args, command, args.out)
    print(args.out.read_text())
