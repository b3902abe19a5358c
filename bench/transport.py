"""CPU per streamed token of the graph's hops: Generate → tier → caller, as the graph runs them.

    python -m bench.transport --out docs/transport-hop.md

Three deployments stand in for the graph's hops, with its transport and
nothing else: ``Source`` (one replica, as Generate) streams token events (the
size of a ``tokens``-mode SSE event) to ``Tier`` (two replicas, as Derender),
which streams each item onward to ``Sink`` (one replica, as the Ingress), which
drives the load. Events are paced like an engine: every ``--pace-ms`` one
step wakes all of a Source replica's streams at once, each writing one event
(0: as fast as the loop goes). Each cell runs ``concurrency``
streams at once, one run per cell, and reports per token delivered:

- the CPU of the Source replica (*Generate side*: its hop out);
- the CPU of both Tier replicas (*tier*: a hop in and its hop onward);
- the CPU of the Sink replica (*caller*: its hop in);

read from the host's process table before and after; and the time from the
Source writing a stream's first event to the Sink receiving it (two hops).
``window``: ``none`` sends one handle item per event; ``W`` joins events per
``deployments.transport.coalesce.coalesce_events`` with a W ms window, in Source and Tier;
``channel`` sends both hops on step channels (``deployments.transport.step_channel``:
one item per step for all the streams between two replicas) with the graph's
default 10 ms window, as the graph runs tier text.

The graph's Serve switches (``deployments.config.serve_env``) are on unless ``--serve-defaults``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
import os
import platform
import statistics
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

from deployments.config.serve_env import SERVE_ENV

TOKEN_EVENT = (
    'data: {"request_id":"generate-tokens-chatcmpl-00000000-0000-0000-0000-000000000000",'
    '"choices":[{"index":0,"token_ids":[1234],"finish_reason":null}]}\n\n'
)
APP = "transport"
# ``channel``: Source → Tier → Sink on step channels with the graph's default
# window (``stream_coalesce_ms``), as the graph runs tier text.
CHANNEL_WINDOW_S = 0.010
STAGES = ("Source", "Tier", "Sink")


class StepClock:
    """Wakes every stream of a replica at once, every ``pace_s``, as an engine step does."""

    def __init__(self, pace_s: float) -> None:
        self._pace_s = pace_s
        self._step = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None

    async def next_step(self) -> None:
        if self._pace_s <= 0:
            await asyncio.sleep(0)
            return
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick())
        await self._step.wait()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._pace_s)
            step, self._step = self._step, asyncio.Event()
            step.set()


def build() -> Any:
    """The three deployments (built after the environment is set: Serve reads it at import)."""
    from ray import serve
    from ray.serve.handle import DeploymentHandle

    from deployments.routing.pinned_router import PINNED_ROUTING
    from deployments.transport.channel_reader import StepChannels
    from deployments.transport.channel_source import ChannelSource
    from deployments.transport.coalesce import coalesced
    from deployments.transport.step_channel import Outboxes

    def replica_id() -> str:
        return str(serve.get_replica_context().replica_id.unique_id)

    @serve.deployment(
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1024,
        request_router_config=PINNED_ROUTING,
    )
    class Source(ChannelSource):
        def __init__(self) -> None:
            self._clocks: dict[float, StepClock] = {}
            self._outboxes = Outboxes(replica_id())
            self._coalesce_s = CHANNEL_WINDOW_S

        async def _events(self, tokens: int, pace_s: float) -> AsyncGenerator[str, None]:
            clock = self._clocks.setdefault(pace_s, StepClock(pace_s))
            yield f"data: {time.time()!r}\n\n"
            for _ in range(tokens):
                await clock.next_step()
                yield TOKEN_EVENT

        async def stream(
            self, tokens: int, pace_s: float, window_s: float | None
        ) -> AsyncIterator[str]:
            events = self._events(tokens, pace_s)
            source = coalesced(events, window_s)
            async for item in source:
                yield item

        async def stream_on_channel(
            self, tokens: int, pace_s: float, caller: str, key: str
        ) -> AsyncIterator[Any]:
            async for item in self._outboxes.bind(self._events(tokens, pace_s), caller, key):
                yield item

    @serve.deployment(
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1024,
        num_replicas=2,
        request_router_config=PINNED_ROUTING,
    )
    class Tier(ChannelSource):
        def __init__(self, source: DeploymentHandle) -> None:
            self._source = source.options(stream=True)
            self._channels = StepChannels(source, replica_id())
            self._outboxes = Outboxes(replica_id())
            self._coalesce_s = CHANNEL_WINDOW_S

        async def relay(
            self, tokens: int, pace_s: float, window_s: float | None
        ) -> AsyncIterator[str]:
            call: Any = self._source.stream.remote(tokens, pace_s, window_s)
            source = coalesced(call, window_s)
            async for item in source:
                yield item

        async def relay_on_channel(
            self, tokens: int, pace_s: float, caller: str, key: str
        ) -> AsyncIterator[Any]:
            """As Derender's ``text_on_channel``: in and onward on step channels."""
            call = self._channels.call("stream_on_channel", tokens, pace_s)
            try:
                async for item in self._outboxes.bind(call, caller, key):
                    yield item
            finally:
                call.cancel()

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
    class Sink:
        def __init__(self, tier: DeploymentHandle) -> None:
            self._tier = tier.options(stream=True)
            self._channels = StepChannels(tier, replica_id())

        async def run(
            self,
            concurrency: int,
            tokens: int,
            pace_s: float,
            window_s: float | None,
            channel: bool = False,
        ) -> dict[str, Any]:
            async def one() -> tuple[int, int, float]:
                items = received = 0
                first_s = -1.0
                call: Any = (
                    self._channels.call("relay_on_channel", tokens, pace_s)
                    if channel
                    else self._tier.relay.remote(tokens, pace_s, window_s)
                )
                async for item in call:
                    if first_s < 0:
                        first_s = time.time() - float(item.split("\n", 1)[0][len("data: ") :])
                    items += 1
                    received += item.count(TOKEN_EVENT)
                return items, received, first_s

            start = time.perf_counter()
            # Each stream in a context of its own, as each is its own request in the
            # graph (Serve routes a request's concurrent handle calls as one).
            tasks = [
                asyncio.create_task(one(), context=contextvars.Context())
                for _ in range(concurrency)
            ]
            results = await asyncio.gather(*tasks)
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
    parser.add_argument("--windows-ms", default="none,10,50,channel")
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
                channel = window == "channel"
                window_s = (
                    CHANNEL_WINDOW_S
                    if channel
                    else None
                    if window == "none"
                    else float(window) / 1000
                )
                pace_s = pace_ms / 1000
                sink.run.remote(2, 8, pace_s, window_s, channel).result(timeout_s=600)  # warm
                before = stage_cpu_s()
                cell = sink.run.remote(concurrency, args.tokens, pace_s, window_s, channel).result(
                    timeout_s=1800
                )
                after = stage_cpu_s()
                us = {s: (after[s] - before[s]) / cell["tokens"] * 1e6 for s in STAGES}
                row = (
                    f"| {pace_ms:g} | {concurrency} | {window} | {cell['tokens']} | "
                    f"{'a step' if channel else format(cell['tokens'] / cell['items'], '.1f')} | "
                    f"{us['Source']:.0f} | "
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
            "CPU µs per token delivered, per stage; *tokens/item*: per stream's handle "
            "item (*a step*: one channel item carries a step of every stream between two "
            "replicas); *first token*: median time from the Source writing a stream's "
            "first event to the Sink receiving it (two hops).",
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
