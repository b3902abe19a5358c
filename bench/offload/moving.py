"""The moving load: one steady load while the engine host's headroom changes under it.

A closed loop of ``--moving-streams`` parsed chats (each client starts its next stream
as one ends) runs ``--phase-s`` per phase; between phases the cluster's processes are
pinned afresh (``--moving``, e.g. shared → disjoint → shared), as when the engine
host's cores are taken by, or given back from, other work. Each placement (I, S, A)
runs the whole timeline in turn. A phase stops starting streams at its end and lets
those running finish, so every stream belongs to one layout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import uvloop

from bench.harness.cluster import LocalCluster
from bench.harness.pinning import HEAD, pin
from bench.harness.timed_stream import TimedStream, timed_chat
from bench.offload.load import Load
from bench.offload.study import (
    PLACEMENTS,
    chat,
    client_cpu_s,
    cpu_between,
    cpu_snapshot,
    layout_cores,
    stream_record,
)


async def closed_loop(
    url: str, streams: int, placement: str, body: dict[str, Any], phase_s: float
) -> list[TimedStream]:
    """``streams`` clients, each streaming one chat after another until ``phase_s``."""
    headers = {"X-Text-Placement": placement}
    deadline = time.monotonic() + phase_s
    done: list[TimedStream] = []

    async def client() -> None:
        while time.monotonic() < deadline:
            done.append(await timed_chat(url, body, headers))

    await asyncio.gather(*(client() for _ in range(streams)))
    return done


def moving_load(
    cluster: LocalCluster,
    base_url: str,
    args: argparse.Namespace,
    engine: set[int],
    text: set[int],
) -> list[dict[str, Any]]:
    pace = args.pace_ms[0]
    body = chat(args.moving_tokens, pace, Load.of(args))
    url = f"{base_url}/v1/chat/completions"
    phases = []
    for placement in PLACEMENTS:
        for index, layout in enumerate(args.moving):
            cores = layout_cores(layout, engine, text)
            pin(cluster.processes(), cores)
            os.sched_setaffinity(0, cores[HEAD])
            before, client_before = cpu_snapshot(cluster), client_cpu_s()
            start = time.monotonic()
            done = uvloop.run(closed_loop(url, args.moving_streams, placement, body, args.phase_s))
            wall = time.monotonic() - start
            cpu = cpu_between(before, cpu_snapshot(cluster))
            cpu["client"] = {"client": round(client_cpu_s() - client_before, 3)}
            requests = [{**stream_record(s), "start_s": round(s.started - start, 3)} for s in done]
            phases.append(
                {
                    "placement": placement,
                    "phase": index,
                    "layout": layout,
                    "pace_ms": pace,
                    "streams": args.moving_streams,
                    "wall_s": round(wall, 3),
                    "requests": requests,
                    "cpu_s": cpu,
                }
            )
            ok = [r for r in requests if r["ok"]]
            tier = sum(r["placed"] == "tier" for r in requests)
            print(
                f"moving {placement}, phase {index} ({layout}): {len(ok)}/{len(requests)} ok, "
                f"{sum(r['tokens'] for r in ok) / wall:.0f} tokens/s, {tier} in the tier",
                flush=True,
            )
    return phases
