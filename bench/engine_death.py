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

Before each kill, ``--streams`` greedy tier chat streams (``--stream-tokens``
tokens each, engine steps paced at 10 ms so they are still running) start and
deliver a first token; they are spread over the replicas by Serve's router.
After the run, each is counted as completed (its whole length, no error event)
or failed: a stream on the killed engine moves to a live replica
(docs/engine-death.md#streams-that-move), or fails when none is live.
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
from bench.harness.sse_reader import Stream
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
    streams_completed: int = 0
    streams_failed: int = 0


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


STREAM_PACE_MS = 10


def tier_stream(base_url: str, seed: int, tokens: int) -> Stream:
    """A greedy tier chat stream of ``tokens`` tokens, paced; a prompt of its own."""
    body = {
        "model": str(TINY_MODEL),
        "messages": [{"role": "user", "content": f"Stream {seed}: count on, one word at a time."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "vllm_xargs": {"pace_ms": STREAM_PACE_MS},
    }
    return Stream(base_url, "/v1/chat/completions", body, {"X-Text-Placement": "tier"})


def stream_completed(stream: Stream, tokens: int) -> bool:
    """The stream ended as an uninterrupted one: no error event, its whole length."""
    errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
    return (
        stream.error is None
        and not errors
        and stream.finish_reasons() == ["length"]
        and stream.token_count() == tokens
    )


def measure(
    replicas: int, runs: int, after: int, limit_s: float, streams: int = 0, stream_tokens: int = 0
) -> list[Outcome]:
    """``runs`` engine deaths, one after another, on one graph of ``replicas`` Generate replicas."""
    args: dict[str, Any] = {
        "model": str(TINY_MODEL),
        "max_model_len": 1024,
        "kv_cache_gib": 1,
        "generate": {"num_replicas": replicas, "num_cpus": 0.3},
        "derender": {"num_replicas": 1, "num_cpus": 0.1},
        # The replica to kill is named by its PID.
        "expose_replica_pid": True,
        # The tier streams' engine steps are paced (bench/harness/paced_decode.py).
        "logits_processors": ["bench.harness.paced_decode:PacedDecode"],
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_graph(Path(tmp), {"default": ("/", args)}) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        outcomes = []
        for run in range(runs):
            wait_all_engines(client, replicas, within_s=300)
            in_flight = [
                tier_stream(server.base_url, run * streams + i, stream_tokens)
                for i in range(streams)
            ]
            for stream in in_flight:
                stream.start()
            for stream in in_flight:
                stream.wait_first(60)
            outcome = kill_one_engine(client, replicas, after, limit_s)
            for stream in in_flight:
                stream.join(limit_s)
                if stream_completed(stream, stream_tokens):
                    outcome.streams_completed += 1
                else:
                    outcome.streams_failed += 1
            outcomes.append(outcome)
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
        "from the one before. Tier chat streams were running on the replicas when the",
        "engine died; a stream completed if it ended with its whole length and no error",
        "event. Seconds after the kill:",
        "",
        "| Generate replicas | run | replica gone | first 200 | all back "
        "| answers not 200 | slowest of them | streams in flight | completed | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
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
            f"| {len(o.failures)}{f' ({failed})' if failed else ''} | {s(slowest)} "
            f"| {o.streams_completed + o.streams_failed} | {o.streams_completed} "
            f"| {o.streams_failed} |"
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
    ap.add_argument("--streams", type=int, default=8, help="tier streams running at each kill")
    ap.add_argument("--stream-tokens", type=int, default=500, help="tokens of each stream")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    outcomes = [
        outcome
        for n in args.replicas.split(",")
        for outcome in measure(
            int(n), args.runs, args.after, args.limit_s, args.streams, args.stream_tokens
        )
    ]
    command = (
        f"python -m bench.engine_death --replicas {args.replicas} --runs {args.runs} "
        f"--streams {args.streams} --stream-tokens {args.stream_tokens}"
    )
    text = report(outcomes, command, kept_notes(args.out) if args.out else "")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
