"""From an engine's death to the graph serving again, on one Generate replica and on two.

    python -m bench.engine_death --out docs/engine-death.md

For each replica count, a graph of the embedded model starts (``serve run`` on
a free port). One inline chat names the Generate replica that served it
(``X-Served-By-Pid``); its EngineCore process is killed with SIGKILL, which is
what any engine death looks like to the replica. From then on one client sends
inline chats back to back (8 tokens, 30 s timeout each) and records each
answer's status and time, until the graph has served ``--after`` 200s in a row
and every Generate replica is back. Reported, in seconds after the kill:

- ``replica gone``: the killed engine's replica process has exited;
- ``first 200``: the first chat answered 200;
- ``all back``: ``/metrics`` lists the configured number of engines again;

and how many answers were not 200 (with their statuses), and whether each
carried ``Retry-After``.
"""

from __future__ import annotations

import argparse
import platform
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.metrics import running_requests
from tests.support.servers import TINY_MODEL, running_graph

SHOWN_FAILURES = 6  # per row of the report; the count covers them all
CHAT = {"model": str(TINY_MODEL), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@dataclass
class Outcome:
    replicas: int
    replica_gone_s: float | None = None
    first_ok_s: float | None = None
    all_back_s: float | None = None
    failures: list[tuple[float, int, bool]] = field(default_factory=list)
    """(seconds after the kill, status, had Retry-After) of each non-200 answer."""


def engine_core(replica_pid: int) -> psutil.Process:
    for child in psutil.Process(replica_pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise RuntimeError(f"no EngineCore under replica {replica_pid}")


def measure(replicas: int, after: int, limit_s: float) -> Outcome:
    outcome = Outcome(replicas)
    args: dict[str, Any] = {
        "model": str(TINY_MODEL),
        "max_model_len": 1024,
        "kv_cache_gib": 1,
        "generate": {"num_replicas": replicas, "num_cpus": 0.3},
        "derender": {"num_replicas": 1, "num_cpus": 0.1},
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_graph(Path(tmp), {"default": ("/", args)}) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        deadline = time.monotonic() + 300
        while len(running_requests(client.get("/metrics").text)) < replicas:
            if time.monotonic() > deadline:
                raise TimeoutError("Generate replicas did not all start")
            time.sleep(1)
        reply = client.post(
            "/v1/chat/completions", json=CHAT, headers={"X-Text-Placement": "inline"}
        )
        reply.raise_for_status()
        replica = psutil.Process(int(reply.headers["X-Served-By-Pid"]))
        engine_core(replica.pid).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        in_a_row = 0
        while time.monotonic() - killed < limit_s:
            now = time.monotonic() - killed
            if outcome.replica_gone_s is None and not replica.is_running():
                outcome.replica_gone_s = now
            try:
                answer = client.post("/v1/chat/completions", json=CHAT)
                status, retry = answer.status_code, "Retry-After" in answer.headers
            except httpx.HTTPError:
                status, retry = 0, False
            at = time.monotonic() - killed
            if status == 200:
                in_a_row += 1
                if outcome.first_ok_s is None:
                    outcome.first_ok_s = at
            else:
                in_a_row = 0
                outcome.failures.append((round(at, 2), status, retry))
            if (
                outcome.all_back_s is None
                and outcome.replica_gone_s is not None
                and len(running_requests(client.get("/metrics").text)) == replicas
            ):
                outcome.all_back_s = time.monotonic() - killed
            if in_a_row >= after and outcome.all_back_s is not None:
                break
            time.sleep(0.1)
    return outcome


def report(outcomes: list[Outcome], command: str) -> str:
    def s(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    lines = [
        "# Engine death: from the kill to serving again",
        "",
        f"`{command}` on {platform.node()} ({psutil.cpu_count()} cores), one run.",
        "An EngineCore process is killed with SIGKILL; one client then sends inline chats",
        "back to back. Seconds after the kill:",
        "",
        "| Generate replicas | replica gone | first 200 | all back | answers not 200 |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        shown = [
            f"{at} s: {status}{' + Retry-After' if retry else ''}"
            for at, status, retry in o.failures[:SHOWN_FAILURES]
        ]
        if len(o.failures) > SHOWN_FAILURES:
            shown.append(f"… the last at {o.failures[-1][0]} s")
        failed = ", ".join(shown)
        lines.append(
            f"| {o.replicas} | {s(o.replica_gone_s)} | {s(o.first_ok_s)} | {s(o.all_back_s)} "
            f"| {len(o.failures)}{f' ({failed})' if failed else ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="2,1", help="comma-separated Generate replica counts")
    ap.add_argument("--after", type=int, default=5, help="200s in a row that end a run")
    ap.add_argument("--limit-s", type=float, default=240)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    outcomes = [measure(int(n), args.after, args.limit_s) for n in args.replicas.split(",")]
    text = report(outcomes, "python -m bench.engine_death " + f"--replicas {args.replicas}")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
