"""How long the graph takes to start, and what its launching process holds.

    python -m bench.startup                          # writes docs/startup.md
    python -m bench.startup --against ../old-checkout --rounds 3

Starts, in turn and ``--rounds`` times: ``serve run graph:app`` as a user types it
(no switch of Ray or Serve exported, usage stats off; port 8000 must be free), the
same from each ``--against`` checkout (its own code, this virtualenv), and vLLM's
own server (``python -m vllm.entrypoints.openai.api_server``) with the graph's
default model, parsers, context length and KV cache. For each: seconds from the
launch to the first chat answered, when Ray's GCS came up (the graph: ``serve run``
builds the application before it starts Ray), and the RSS of the launching process
(``serve run``'s CLI, which stays up for the graph's life; vLLM's API server) and of
its whole process tree, at that first answer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from bench.harness.host import host_line
from bench.harness.servers import (
    PRISTINE_ENV,
    REPO,
    SERVE_RUN_STOP_GRACE_S,
    VENV_BIN,
    port_is_free,
    running,
    running_vllm,
)
from deployments.config.graph_config import GraphConfig

SERVE_DEFAULT_PORT = 8000
GRAPH = "graph (serve run graph:app)"
VLLM = "vLLM's server"
MiB = 2**20


@dataclass
class Start:
    server: str
    round: int
    first_chat_s: float
    gcs_up_s: float | None
    launcher_rss_mib: float
    tree_rss_mib: float


class GcsWatch:
    """When a ``gcs_server`` first appears under a process (polled every 0.1 s)."""

    def __init__(self, started: float) -> None:
        self._started = started
        self.at: float | None = None
        self.pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, pid: int) -> None:
        self.pid = pid
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1) and self.at is None and self.pid is not None:
            try:
                names = [p.name() for p in psutil.Process(self.pid).children(recursive=True)]
            except psutil.Error:
                continue
            if any(name.startswith("gcs_server") for name in names):
                self.at = time.monotonic() - self._started

    def stop(self) -> None:
        self._stop.set()


def tree_rss(pid: int) -> tuple[float, float]:
    """RSS of ``pid`` and of it with every descendant, in MiB."""
    root = psutil.Process(pid)
    own = root.memory_info().rss
    total = own
    for child in root.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return own / MiB, total / MiB


def first_chat(base_url: str) -> None:
    """One short chat, retried until the graph routes it (health comes first)."""
    model = httpx.get(f"{base_url}/v1/models", timeout=60).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    deadline = time.monotonic() + 120
    while True:
        reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
        if reply.status_code == 200 and reply.json()["choices"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no chat answered: {reply.status_code} {reply.text[:200]}")
        time.sleep(0.5)


def start_graph(checkout: Path, label: str, round_: int, work: Path) -> Start:
    """``serve run graph:app`` of ``checkout``'s code, to its first chat answered."""
    started = time.monotonic()
    gcs = GcsWatch(started)
    argv = [str(VENV_BIN / "serve"), "run", "graph:app"]
    # Nothing of Ray's or Serve's exported: graph.py sets the switches itself.
    unset = [name for name in PRISTINE_ENV if name.startswith("RAY_")]
    with running(
        argv,
        port=SERVE_DEFAULT_PORT,
        log_path=work / f"graph-{revision(checkout)}-{round_}.log",
        # The checkout's own code in every Ray process: this virtualenv's editable
        # install would give a worker whose cwd is elsewhere this repo's.
        env={"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(checkout)},
        unset=unset,
        cwd=checkout,
        on_start=lambda process: gcs.watch(process.pid),
        stop_grace_s=SERVE_RUN_STOP_GRACE_S,
    ) as server:
        first_chat(server.base_url)
        ready = time.monotonic() - started
        own, total = tree_rss(server.process.pid)
    gcs.stop()
    return Start(label, round_, ready, gcs.at, own, total)


def start_vllm(round_: int, work: Path) -> Start:
    config = GraphConfig.from_args({"reasoning_parser": "qwen3", "tool_call_parser": "hermes"})
    model = Path(config.model)
    max_len = (
        config.max_model_len
        or json.loads((model / "config.json").read_text())["max_position_embeddings"]
    )
    started = time.monotonic()
    with running_vllm(
        work / f"vllm-{round_}.log",
        model=model,
        max_model_len=max_len,
        kv_cache_gib=config.kv_cache_gib,
        reasoning_parser=config.reasoning_parser,
        tool_call_parser=config.tool_call_parser,
        enforce_eager=config.enforce_eager,
    ) as server:
        first_chat(server.base_url)
        ready = time.monotonic() - started
        own, total = tree_rss(server.process.pid)
    return Start(VLLM, round_, ready, None, own, total)


def revision(checkout: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or checkout.name


def _cell(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}–{max(values):.{digits}f})"
    )


def report(starts: list[Start], command: str, host: str) -> str:
    """docs/startup.md: a summary per server (median, range over rounds), then each start."""
    labels = list(dict.fromkeys(s.server for s in starts))
    rounds = len({s.round for s in starts})
    lines = [
        "# Start-up: the graph against vLLM's own server",
        "",
        f"Written by `{command}` ({rounds} round(s), servers started in turn; {host}).",
        "",
        # The module's description, its reStructuredText literals as Markdown's.
        __doc__.split("\n\n", 2)[2].strip().replace("``", "`"),
        "",
        "| server | first chat answered (s) | Ray's GCS up (s) | launcher RSS (MiB) "
        "| process tree RSS (MiB) |",
        "|---|---|---|---|---|",
    ]
    for label in labels:
        mine = [s for s in starts if s.server == label]
        gcs = [s.gcs_up_s for s in mine if s.gcs_up_s is not None]
        lines.append(
            f"| {label} | {_cell([s.first_chat_s for s in mine])} | {_cell(gcs)} "
            f"| {_cell([s.launcher_rss_mib for s in mine], 0)} "
            f"| {_cell([s.tree_rss_mib for s in mine], 0)} |"
        )
    lines += [
        "",
        "Median (range) over rounds. Each start:",
        "",
        "| round | server | first chat (s) | GCS up (s) | launcher RSS (MiB) | tree RSS (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for s in starts:
        gcs_text = "—" if s.gcs_up_s is None else f"{s.gcs_up_s:.1f}"
        lines.append(
            f"| {s.round} | {s.server} | {s.first_chat_s:.1f} | {gcs_text} "
            f"| {s.launcher_rss_mib:.0f} | {s.tree_rss_mib:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    cli = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    cli.add_argument("--rounds", type=int, default=2)
    cli.add_argument("--against", type=Path, action="append", default=[])
    cli.add_argument("--work", type=Path, default=Path("/tmp/bench-startup"))
    cli.add_argument("--out", type=Path, default=REPO / "docs" / "startup.md")
    args = cli.parse_args(argv)
    if not port_is_free(SERVE_DEFAULT_PORT):
        raise SystemExit(f"port {SERVE_DEFAULT_PORT} (serve run's default) is taken")
    args.work.mkdir(parents=True, exist_ok=True)
    graphs = [(REPO, f"{GRAPH}, {revision(REPO)}")]
    graphs += [(path.resolve(), f"{GRAPH}, {revision(path)}") for path in args.against]
    starts: list[Start] = []
    for round_ in range(args.rounds):
        for checkout, label in graphs:
            starts.append(start_graph(checkout, label, round_, args.work))
            print(asdict(starts[-1]), flush=True)
        starts.append(start_vllm(round_, args.work))
        print(asdict(starts[-1]), flush=True)
    command = " ".join(["python -m bench.startup", *(argv if argv is not None else sys.argv[1:])])
    args.out.write_text(report(starts, command, host_line()))
    (args.work / "starts.json").write_text(json.dumps([asdict(s) for s in starts], indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
