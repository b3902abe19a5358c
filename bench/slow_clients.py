"""Keyed traffic beside slow clients without the key: a bounded slowloris on 127.0.0.1.

    python -m bench.slow_clients --out docs/slow-clients.md

A graph of the embedded model with an API key starts (``serve run`` on a free
port, the product's Serve switches). Each round opens ``--slow`` connections
that send the headers of ``POST /tokenize`` (open, as in vLLM) and one byte of
a 64-byte body, then nothing, back to back (they arrive as a burst). From the
last one on, keyed ``GET /v1/models`` go back to back for ``--watch-s`` while
the graph works the burst off; then ``--probes`` of each probe (a keyed
``GET /v1/models``, ``GET /health``, a keyed ``POST /tokenize``) one after
another, each answer's status and time recorded; then the slow connections
close. A round with no slow clients comes first, for the idle times. Reported
per round: the burst's first and slowest answers, the probes' p50 and max, and
how many slow clients were refused at once (503) rather than held.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.cli import reproducing_command
from bench.harness.servers import TINY_MODEL, running_graph

API_KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROBES = {
    "GET /v1/models (keyed)": ("GET", "/v1/models", None, AUTH),
    "GET /health": ("GET", "/health", None, {}),
    "POST /tokenize (keyed)": ("POST", "/tokenize", {"prompt": "hi"}, AUTH),
}


@dataclass
class Round:
    slow: int
    opening_s: float = 0.0
    """How long opening the slow connections took (they arrive as a burst)."""
    watch: list[tuple[float, float, int]] = field(default_factory=list)
    """(seconds after the last slow connection opened, answer time, status) of keyed
    ``GET /v1/models`` sent back to back from then on, while the burst is worked off."""
    times: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[str, list[int]] = field(default_factory=dict)
    refused: int = 0


def _slow_connection(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 64\r\n\r\n{"
    )
    return sock


def one_round(base_url: str, port: int, slow: int, probes: int, watch_s: float) -> Round:
    result = Round(slow)
    start = time.perf_counter()
    held = [_slow_connection(port) for _ in range(slow)]
    opened = time.perf_counter()
    result.opening_s = opened - start
    try:
        with httpx.Client(base_url=base_url, timeout=60) as client:
            name, (method, path, body, headers) = next(iter(PROBES.items()))
            while (sent := time.perf_counter()) - opened < watch_s:
                response = client.request(method, path, json=body, headers=headers)
                took = time.perf_counter() - sent
                result.watch.append((sent - opened, took, response.status_code))
            # The burst is worked off: the probes at their steady pace.
            for name, (method, path, body, headers) in PROBES.items():
                for _ in range(probes):
                    start = time.perf_counter()
                    response = client.request(method, path, json=body, headers=headers)
                    result.times.setdefault(name, []).append(time.perf_counter() - start)
                    result.statuses.setdefault(name, []).append(response.status_code)
        for sock in held:
            sock.settimeout(0.05)
            with contextlib.suppress(OSError):
                result.refused += sock.recv(64).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()
    return result


def report(rounds: list[Round], command: str) -> str:
    lines = [
        "# Keyed requests beside slow clients without the key",
        "",
        f"`{command}` on {platform.node()} ({psutil.cpu_count()} cores): each slow client "
        "sent the headers of `POST /tokenize` and one byte of a 64-byte body, then nothing, "
        "all opened back to back (a burst). From the last one on, keyed `GET /v1/models` "
        "went back to back while the graph worked the burst off; then each probe ran "
        "one after another while the slow clients hung on. Times in ms.",
        "",
        "## While the burst arrives",
        "",
        "| round | slow clients | opening them took | first answer | slowest answer | "
        "answers | all 200 | slowest after 2 s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for number, r in enumerate(rounds):
        if not r.watch:
            continue
        late = [took for at, took, _ in r.watch if at >= 2.0]
        lines.append(
            f"| {number} | {r.slow} | {r.opening_s * 1000:.0f} | {r.watch[0][1] * 1000:.1f} "
            f"| {max(t for _, t, _ in r.watch) * 1000:.1f} | {len(r.watch)} "
            f"| {all(s == 200 for _, _, s in r.watch)} "
            f"| {max(late) * 1000 if late else float('nan'):.1f} |"
        )
    lines += [
        "",
        "## Then, while they hang on",
        "",
        "| round | slow clients | refused at once (503) | probe | statuses | p50 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, r in enumerate(rounds):
        for name, times in r.times.items():
            ms = [t * 1000 for t in times]
            statuses = ",".join(f"{s}×{r.statuses[name].count(s)}" for s in set(r.statuses[name]))
            lines.append(
                f"| {number} | {r.slow} | {r.refused} | {name} | {statuses} "
                f"| {statistics.median(ms):.1f} | {max(ms):.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=int, default=1050, help="slow clients per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds with slow clients")
    ap.add_argument("--probes", type=int, default=20, help="answers timed per probe and round")
    ap.add_argument("--watch-s", type=float, default=5.0, help="keyed probes after the burst")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    graph = {"model": str(TINY_MODEL), "api_key": API_KEY, "kv_cache_gib": 1}
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_graph(Path(tmp), {"default": ("/", graph)}) as server,
    ):
        port = int(server.base_url.rsplit(":", 1)[1])
        rounds = [one_round(server.base_url, port, 0, args.probes, 0.0)]
        rounds += [
            one_round(server.base_url, port, args.slow, args.probes, args.watch_s)
            for _ in range(args.rounds)
        ]
    text = report(rounds, reproducing_command("bench.slow_clients", ap, args))
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
