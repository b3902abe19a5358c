"""From an engine's death to the graph serving again, on one Generate replica and on two.

    python -m bench.engine_death --out docs/engine-death.md

For each replica count, a graph of the embedded model starts (``serve run`` on
a free port), and ``--runs`` engines die on it, one after another, each once
every engine is back from the one before. One inline chat names the Generate replica that served it
(``X-Served-By-Pid``); its EngineCore process is killed with SIGKILL, which is
what any engine death looks like to the replica. From then on one client sends
inline chats back to back (8 tokens, 30 s timeout each) and records each
answer's status and time, until the graph has served ``--after`` 200s in a row
and every Generate replica is back. Reported, in seconds after the kill:

- ``replica gone``: the killed engine's replica process has exited;
- ``first 200``: the first chat answered 200;
- ``all back``: ``/metrics`` lists the configured number of engines again;

and how many answers were not 200 (by status, and whether they carried
``Retry-After``), and how long the slowest of them took: a request that waits
for a replica to start shows here.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.harness.servers import TINY_MODEL, running_graph
from bench.metrics import running_requests

KEPT = "<!-- notes below are kept when the command rewrites this file -->"
CHAT = {"model": str(TINY_MODEL), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@dataclass
class Outcome:
    replicas: int
    replica_gone_s: float | None = None
    first_ok_s: float | None = None
    all_back_s: float | None = None
    failures: list[tuple[float, int, bool, float]] = field(default_factory=list)
    """(seconds after the kill, status, had Retry-After, seconds it took) of each non-200."""


def replica_processes(app: str, deployment: str) -> list[psutil.Process]:
    """This host's replica processes of one deployment (Ray titles them
    ``ray::ServeReplica:<app>:<deployment>``)."""
    title = f"ray::ServeReplica:{app}:{deployment}"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            words = " ".join(process.info["cmdline"] or []).split()
            # Also while it runs a method (``…:Generate.handle_request``).
            if words and (words[0] == title or words[0].startswith(title + ".")):
                found.append(process)
    return found


def engine_core(replica_pid: int) -> psutil.Process:
    for child in psutil.Process(replica_pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise RuntimeError(f"no EngineCore under replica {replica_pid}")


def measure(replicas: int, runs: int, after: int, limit_s: float) -> list[Outcome]:
    """``runs`` engine deaths, one after another, on one graph of ``replicas`` Generate replicas."""
    args: dict[str, Any] = {
        "model": str(TINY_MODEL),
        "max_model_len": 1024,
        "kv_cache_gib": 1,
        "generate": {"num_replicas": replicas, "num_cpus": 0.3},
        "derender": {"num_replicas": 1, "num_cpus": 0.1},
        # The replica to kill is named by its PID.
        "expose_replica_pid": True,
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_graph(Path(tmp), {"default": ("/", args)}) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        outcomes = []
        for _ in range(runs):
            wait_all_engines(client, replicas, within_s=300)
            outcomes.append(kill_one_engine(client, replicas, after, limit_s))
        return outcomes


def wait_all_engines(client: httpx.Client, replicas: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while len(running_requests(client.get("/metrics").text)) < replicas:
        if time.monotonic() > deadline:
            raise TimeoutError("Generate replicas did not all start")
        time.sleep(1)


def kill_one_engine(client: httpx.Client, replicas: int, after: int, limit_s: float) -> Outcome:
    outcome = Outcome(replicas)
    reply = client.post("/v1/chat/completions", json=CHAT, headers={"X-Text-Placement": "inline"})
    reply.raise_for_status()
    replica = psutil.Process(int(reply.headers["X-Served-By-Pid"]))
    engine_core(replica.pid).send_signal(signal.SIGKILL)
    killed = time.monotonic()
    in_a_row = 0
    while time.monotonic() - killed < limit_s:
        now = time.monotonic() - killed
        if outcome.replica_gone_s is None and not replica.is_running():
            outcome.replica_gone_s = now
        sent = time.monotonic()
        try:
            answer = client.post("/v1/chat/completions", json=CHAT)
            status, retry = answer.status_code, "Retry-After" in answer.headers
        except httpx.HTTPError:
            status, retry = 0, False
        at = time.monotonic() - killed
        took = time.monotonic() - sent
        if status == 200:
            in_a_row += 1
            if outcome.first_ok_s is None:
                outcome.first_ok_s = at
        else:
            in_a_row = 0
            outcome.failures.append((round(at, 2), status, retry, took))
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


def report(outcomes: list[Outcome], command: str, kept: str = "") -> str:
    def s(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    runs = Counter(o.replicas for o in outcomes)
    lines = [
        "# Engine death: from the kill to serving again",
        "",
        f"`{command}` on {platform.node()} ({psutil.cpu_count()} cores).",
        "An EngineCore process is killed with SIGKILL; one client then sends inline chats",
        "back to back (30 s timeout each). Each death waits until every engine is back",
        "from the one before. Seconds after the kill:",
        "",
        "| Generate replicas | run | replica gone | first 200 | all back "
        "| answers not 200 | slowest of them |",
        "|---|---|---|---|---|---|---|",
    ]
    number: Counter[int] = Counter()
    for o in outcomes:
        number[o.replicas] += 1
        kinds = Counter(
            f"{status}{' + Retry-After' if retry else ''}" for _, status, retry, _ in o.failures
        )
        failed = ", ".join(f"{n} × {kind}" for kind, n in sorted(kinds.items()))
        slowest = max((took for *_, took in o.failures), default=None)
        lines.append(
            f"| {o.replicas} | {number[o.replicas]} of {runs[o.replicas]} "
            f"| {s(o.replica_gone_s)} | {s(o.first_ok_s)} | {s(o.all_back_s)} "
            f"| {len(o.failures)}{f' ({failed})' if failed else ''} | {s(slowest)} |"
        )
    lines += ["", "Status 0: the client's 30 s timeout (a request that waited)."]
    return "\n".join(lines) + "\n" + (f"\n{KEPT}\n{kept}" if kept else "")


def kept_notes(path: Path) -> str:
    """What follows ``KEPT`` in an earlier report: notes a person added, kept as is."""
    if not path.exists():
        return ""
    _, found, notes = path.read_text().partition(KEPT + "\n")
    return notes if found else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="2,1", help="comma-separated Generate replica counts")
    ap.add_argument("--runs", type=int, default=3, help="engine deaths per replica count")
    ap.add_argument("--after", type=int, default=5, help="200s in a row that end a run")
    ap.add_argument("--limit-s", type=float, default=240)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    outcomes = [
        outcome
        for n in args.replicas.split(",")
        for outcome in measure(int(n), args.runs, args.after, args.limit_s)
    ]
    command = f"python -m bench.engine_death --replicas {args.replicas} --runs {args.runs}"
    text = report(outcomes, command, kept_notes(args.out) if args.out else "")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
