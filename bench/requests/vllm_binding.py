"""vLLM's server with its engine bound three ways: what binding is worth to vLLM itself.

    python -m bench.requests.vllm_binding --out docs/request-overhead/vllm-binding.md

One vLLM server (``bench.requests``' baseline: ``VLLM_CPU_OMP_THREADS_BIND=nobind``, the
graph's engine threads), the load of ``bench.requests`` (short streamed chats, closed
loop), and between cells its engine processes' affinity changed, every thread:

- ``unbound``: the EngineCore and the worker on every core (the benches' baseline);
- ``worker``: the worker on the first core, the EngineCore on any: what vLLM's own default,
  ``VLLM_CPU_OMP_THREADS_BIND=auto``, does with one engine thread (it binds the worker's
  threads only, and reserves the rest for the EngineCore without binding it there);
- ``engine``: both on the first core, as a Generate replica binds its engine by default
  (``generate.cpu_cores: auto``, ``deployments/vllm_adapter/engine_start.py``).

The bindings alternate within each round (the order reversed every other round), so each
ratio to ``unbound`` is between cells seconds apart on one server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench.harness.host import host_line
from bench.harness.pinning import engine_processes, set_cores
from bench.harness.servers import Server
from bench.requests.figures import cpu_ms, rounds, rps, ttft_p50
from bench.requests.load import ShortChats
from bench.requests.report import cells_table, commit_id
from bench.requests.study import (
    ServerRun,
    add_load_options,
    measure_cell,
    record_cell,
    requests_vllm,
)
from deployments.config.graph_config import TINY_MODEL

BINDINGS = ("unbound", "worker", "engine")


def bind(server: Server, binding: str) -> None:
    """The server's engine processes as ``binding`` names."""
    every = sorted(os.sched_getaffinity(0))
    first = every[:1]
    core, worker = engine_processes(server.process.pid)
    set_cores(core.pid, first if binding == "engine" else every)
    set_cores(worker.pid, every if binding == "unbound" else first)


def ratio_table(runs: dict[str, ServerRun], concurrencies: list[int]) -> list[str]:
    """Each binding ÷ ``unbound``, round by round: median (spread)."""
    lines = [
        "| binding | concurrency | requests/s ÷ unbound | CPU/request ÷ unbound "
        "| TTFT p50 − unbound, ms |",
        "|---|---|---|---|---|",
    ]
    base = runs["unbound"]
    for label, run in runs.items():
        if label == "unbound":
            continue
        for concurrency in concurrencies:
            pairs = list(
                zip(
                    rounds(run, "vllm", concurrency), rounds(base, "vllm", concurrency), strict=True
                )
            )
            figures = []
            for value, fmt in (
                (lambda a, b: rps(a) / rps(b), ".2f"),
                (lambda a, b: cpu_ms(a) / cpu_ms(b), ".2f"),
                (lambda a, b: ttft_p50(a) - ttft_p50(b), ".0f"),
            ):
                got = [value(a, b) for a, b in pairs]
                figures.append(
                    f"{statistics.median(got):{fmt}} ({min(got):{fmt}}–{max(got):{fmt}})"
                )
            lines.append(f"| {label} | {concurrency} | {' | '.join(figures)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_load_options(parser, requests=300)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args()
    runs = {
        label: ServerRun(label, "python -m vllm.entrypoints.openai.api_server")
        for label in BINDINGS
    }
    load = ShortChats(model=str(TINY_MODEL), tokens=args.tokens)
    with (
        tempfile.TemporaryDirectory(prefix="vllm-binding-") as tmp,
        requests_vllm(Path(tmp) / "vllm.log") as server,
    ):
        for binding in BINDINGS:
            bind(server, binding)
            measure_cell(server, "warm-up", load, "vllm", 4, 16)  # not kept
        for round_ in range(args.repeat):
            order = BINDINGS if round_ % 2 == 0 else tuple(reversed(BINDINGS))
            for concurrency in args.concurrency:
                for binding in order:
                    bind(server, binding)
                    cell = measure_cell(
                        server, binding, load, "vllm", concurrency, args.requests, round_
                    )
                    record_cell(runs[binding], cell)
    command = (
        f"python -m bench.requests.vllm_binding --tokens {args.tokens} --requests "
        f"{args.requests} --concurrency {','.join(map(str, args.concurrency))} "
        f"--repeat {args.repeat}"
    )
    text = "\n".join(
        [
            "# vLLM's server, its engine bound three ways",
            "",
            f"Written by `{command}` at commit {commit_id()}.",
            "",
            f"Host: {host_line()}. Bindings (`bench/requests/vllm_binding.py`): `unbound` "
            "EngineCore and worker on every core (the benches' vLLM baseline); `worker` the "
            "worker on the first core, the EngineCore on any (vLLM's default `auto` with one "
            "engine thread); `engine` both on the first core (the graph's default for its "
            "own engine). Figures: median over rounds (spread).",
            "",
            *cells_table(list(runs.values())),
            "",
            *ratio_table(runs, args.concurrency),
            "",
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
