"""CPU per streamed token of the graph's hops: Generate → tier → caller, as the graph runs them.

    python -m bench.transport --out docs/transport-hop.md

Three deployments stand in for the graph's hops, with its transport and
nothing else: ``Source`` (one replica, as Generate) streams token events (the
size of a ``tokens``-mode SSE event) to ``Tier`` (two replicas, as Derender),
which streams each item onward to ``Sink`` (one replica, as the Ingress), which
drives the load. Events are paced like an engine: one per stream every
``--pace-ms`` (0: as fast as the loop goes). Each cell runs ``concurrency``
streams at once, one run per cell, and reports per token delivered:

- the CPU of the Source replica (*Generate side*: its hop out);
- the CPU of both Tier replicas (*tier*: a hop in and its hop onward);
- the CPU of the Sink replica (*caller*: its hop in);

read from the host's process table before and after; and the time from the
Source writing a stream's first event to the Sink receiving it (two hops).
``window``: ``none`` sends one handle item per event; ``W`` joins events per
``deployments.coalesce.coalesce_events`` with a W ms window, in Source and Tier.

The graph's Serve switches (``deployments.ray_env``) are on unless ``--serve-defaults``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from deployments.ray_env import SERVE_ENV

TOKEN_EVENT = (
    'data: {"request_id":"generate-tokens-chatcmpl-00000000-0000-0000-0000-000000000000",'
    '"choices":[{"index":0,"token_ids":[1234],"finish_reason":null}]}\n\n'
)
APP = "transport"
STAGES = ("Source", "Tier", "Sink")


def build() -> Any:
    """The three deployments (built after the environment is set: Serve reads it at import)."""
    from ray import serve
    from ray.serve.handle import DeploymentHandle

    from deployments.coalesce import coalesce_events

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
    class Source:
        async def stream(
            self, tokens: int, pace_s: float, window_s: float | None
        ) -> AsyncIterator[str]:
            async def events() -> AsyncIterator[str]:
                yield f"data: {time.time()!r}\n\n"
                for _ in range(tokens):
                    yield TOKEN_EVENT
                    await asyncio.sleep(pace_s)

            source = events() if window_s is None else coalesce_events(events(), window_s)
            async for item in source:
                yield item

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024, num_replicas=2)
    class Tier:
        def __init__(self, source: DeploymentHandle) -> None:
            self._source = source.options(stream=True)

        async def relay(
            self, tokens: int, pace_s: float, window_s: float | None
        ) -> AsyncIterator[str]:
            async def items() -> AsyncIterator[str]:
                call: Any = self._source.stream.remote(tokens, pace_s, window_s)
                async for item in call:
                    yield item

            source = items() if window_s is None else coalesce_events(items(), window_s)
            async for item in source:
                yield item

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
    class Sink:
        def __init__(self, tier: DeploymentHandle) -> None:
            self._tier = tier.options(stream=True)

        async def run(
            self, concurrency: int, tokens: int, pace_s: float, window_s: float | None
        ) -> dict[str, Any]:
            async def one() -> tuple[int, int, float]:
                items = received = 0
                first_s = -1.0
                call: Any = self._tier.relay.remote(tokens, pace_s, window_s)
                async for item in call:
                    if first_s < 0:
                        first_s = time.time() - float(item.split("\n", 1)[0][len("data: ") :])
                    items += 1
                    received += item.count(TOKEN_EVENT)
                return items, received, first_s

            start = time.perf_counter()
            results = await asyncio.gather(*(one() for _ in range(concurrency)))
            delivered = sum(r[1] for r in results)
            assert delivered == concurrency * tokens, (delivered, concurrency * tokens)
            return {
                "items": sum(r[0] for r in results),
                "tokens": delivered,
                "wall_s": time.perf_counter() - start,
                "first_ms": statistics.median(r[2] for r in results) * 1000,
            }

    return cast(Any, Sink).bind(cast(Any, Tier).bind(cast(Any, Source).bind()))


def stage_cpu_s() -> dict[str, float]:
    """CPU seconds so far of each stage's replica processes (``ray::ServeReplica:transport:X``)."""
    from bench.engine_death import replica_processes

    cpu: dict[str, float] = {}
    for stage in STAGES:
        total = 0.0
        for process in replica_processes(APP, stage):
            times = process.cpu_times()
            total += times.user + times.system
        cpu[stage] = total
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--pace-ms", default="0,15", help="engine step per stream (ms)")
    parser.add_argument("--windows-ms", default="none,10,50")
    parser.add_argument(
        "--serve-defaults", action="store_true", help="without the graph's Serve switches"
    )
    parser.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    args = parser.parse_args()
    # This driver only starts the load and keeps Serve's defaults (its handle needs
    # no event loop); every Ray process started from here on gets the switches.
    import ray
    from ray import serve

    if not args.serve_defaults:
        os.environ.update(SERVE_ENV)

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    sink = serve.run(build(), name=APP, route_prefix=None)
    rows: list[str] = []
    for pace_ms in [float(p) for p in args.pace_ms.split(",")]:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for window in args.windows_ms.split(","):
                window_s = None if window == "none" else float(window) / 1000
                sink.run.remote(2, 8, pace_ms / 1000, window_s).result(timeout_s=600)  # warm
                before = stage_cpu_s()
                cell = sink.run.remote(concurrency, args.tokens, pace_ms / 1000, window_s).result(
                    timeout_s=1800
                )
                after = stage_cpu_s()
                us = {s: (after[s] - before[s]) / cell["tokens"] * 1e6 for s in STAGES}
                row = (
                    f"| {pace_ms:g} | {concurrency} | {window} | {cell['tokens']} | "
                    f"{cell['tokens'] / cell['items']:.1f} | {us['Source']:.0f} | "
                    f"{us['Tier']:.0f} | {us['Sink']:.0f} | {cell['first_ms']:.1f} | "
                    f"{cell['wall_s']:.2f} |"
                )
                print(row, flush=True)
                rows.append(row)
    serve.shutdown()
    ray.shutdown()
    switches = "Serve's defaults" if args.serve_defaults else f"`{SERVE_ENV}`"
    report = "\n".join(
        [
            "# Transport cost of the graph's streamed handle hops",
            "",
            "`python -m bench.transport "
            f"--concurrency {args.concurrency} --tokens {args.tokens} "
            f"--pace-ms {args.pace_ms} --windows-ms {args.windows_ms}"
            f"{' --serve-defaults' if args.serve_defaults else ''}`",
            "",
            f"Host: {platform.machine()}, Ray {ray.__version__}, {switches}; Source (as "
            "Generate, 1 replica) → Tier (as Derender, 2 replicas) → Sink (as the Ingress, "
            "1 replica), all on one 2-core machine; one run per cell.",
            "",
            "CPU µs per token delivered, per stage; *first token*: median time from the "
            "Source writing a stream's first event to the Sink receiving it (two hops).",
            "",
            "| pace ms | streams | window ms | tokens | tokens/item | Generate side µs "
            "| tier µs (in + onward) | caller µs | first token ms | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Targets (issue 13), at a 15 ms pace with 64 streams: Generate side ≤ 20 µs, "
            "tier ≤ 60 µs, first token ≤ 3 ms added per hop. A window only joins events that "
            "arrive within it: at a 15 ms engine step, a 10 ms window joins nothing.",
            "",
        ]
    )
    if args.out:
        args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
