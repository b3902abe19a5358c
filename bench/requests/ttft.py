"""Where a short chat's time to first token goes, hop by hop: vLLM's server and the graph.

    python -m bench.requests.ttft --out docs/ttft-breakdown.md

One chat at a time (concurrency 1, the load of ``bench.requests``), each with a
W3C ``traceparent`` of its own. Both servers send their spans to an OTLP collector
in this process: vLLM's server through ``--otlp-traces-endpoint`` (its
``llm_request`` span, which starts where its engine client takes the request
and carries the engine's time to first token), the graph through
``observability.otlp_traces_endpoint`` (the Ingress's ``POST`` span, Render's
``render``, Derender's ``derender``, Generate's ``generate`` and the same
``llm_request`` from its engine). With the client's own send and first-output
times, each request's TTFT splits into stages (``stages``). The servers run side
by side, their blocks of requests alternating, the one not measured stopped
(``bench/harness/freeze.py``), as ``bench.requests`` runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.harness.freeze import frozen
from bench.harness.host import host_line
from bench.harness.otlp_collector import Collector, Span, running_collector
from bench.harness.servers import Server
from bench.harness.sse_chunks import json_chunks
from bench.requests.load import ShortChats, carries_output
from bench.requests.report import commit_id
from bench.requests.study import GRAPH_MODES, graph_server, requests_vllm
from deployments.config.graph_config import TINY_MODEL
from deployments.config.serve_env import SERVE_ENV

# vLLM's attribute on its llm_request span: arrival at its engine client → first token
# back in that process (seconds).
TTFT_ATTRIBUTE = "gen_ai.latency.time_to_first_token"
ENGINE_TTFT = "engine: queue, prefill, first token"
BACK = "first token → client (text, hops back, HTTP)"
# Stage names in the order a request meets them; a server has the ones its spans make.
STAGE_ORDER = (
    "client → server's HTTP app",
    "app → Render call",
    "render (Render replica)",
    "Render back → Derender call",
    "Derender → Generate call",
    "Render back → Generate call",
    "Generate call → engine",
    "client → engine (HTTP, render)",
    ENGINE_TTFT,
    BACK,
)


@dataclass
class Sent:
    server: str
    mode: str
    trace_id: str
    sent_ns: int
    first_ns: int


@dataclass
class Breakdown:
    server: str
    mode: str
    stages: dict[str, list[float]] = field(default_factory=dict)
    ttft_ms: list[float] = field(default_factory=list)
    missing: int = 0


def _one(spans: Sequence[Span], name: str) -> Span | None:
    found = [s for s in spans if s.name == name or (name == "POST" and s.name.startswith("POST "))]
    return found[0] if len(found) == 1 else None


def stages(spans: Sequence[Span], sent_ns: int, first_ns: int) -> dict[str, float] | None:
    """One request's TTFT in ms by stage, from its trace's spans and the client's
    send and first-output times (all on this host's clock); None when a span it
    needs is missing. The stages add up to the client's TTFT."""
    llm = _one(spans, "llm_request")
    if llm is None or TTFT_ATTRIBUTE not in llm.attributes:
        return None
    first_token_ns = llm.start_ns + int(float(llm.attributes[TTFT_ATTRIBUTE]) * 1e9)
    tail = {ENGINE_TTFT: first_token_ns - llm.start_ns, BACK: first_ns - first_token_ns}
    post = _one(spans, "POST")
    if post is None:  # vLLM's server: its HTTP app and render run before its engine client
        out = {"client → engine (HTTP, render)": llm.start_ns - sent_ns, **tail}
        return {name: ns / 1e6 for name, ns in out.items()}
    render, generate = _one(spans, "render"), _one(spans, "generate")
    if render is None or generate is None:
        return None
    out = {
        "client → server's HTTP app": post.start_ns - sent_ns,
        "app → Render call": render.start_ns - post.start_ns,
        "render (Render replica)": render.end_ns - render.start_ns,
    }
    derender = _one(spans, "derender")
    if derender is not None:
        out["Render back → Derender call"] = derender.start_ns - render.end_ns
        out["Derender → Generate call"] = generate.start_ns - derender.start_ns
    else:
        out["Render back → Generate call"] = generate.start_ns - render.end_ns
    out["Generate call → engine"] = llm.start_ns - generate.start_ns
    return {name: ns / 1e6 for name, ns in {**out, **tail}.items()}


def breakdowns(sent: Sequence[Sent], collector: Collector) -> list[Breakdown]:
    """Every request's stages, grouped by server and mode."""
    groups: dict[tuple[str, str], Breakdown] = {}
    for request in sent:
        group = groups.setdefault(
            (request.server, request.mode), Breakdown(request.server, request.mode)
        )
        split = stages(collector.spans(request.trace_id), request.sent_ns, request.first_ns)
        if split is None:
            group.missing += 1
            continue
        group.ttft_ms.append((request.first_ns - request.sent_ns) / 1e6)
        for name, ms in split.items():
            group.stages.setdefault(name, []).append(ms)
    return list(groups.values())


async def _block(
    server: Server, label: str, mode: str, load: ShortChats, n: int, gap_s: float = 0.0
) -> list[Sent]:
    headers = {} if mode == "vllm" else {"X-Text-Placement": mode}
    sent = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        for i in range(n):
            await asyncio.sleep(gap_s)
            trace_id = secrets.token_hex(16)
            traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
            sent_ns, first_ns = time.time_ns(), 0
            body = load.body(i)
            async for chunk in json_chunks(
                client, "/v1/chat/completions", body, {**headers, "traceparent": traceparent}
            ):
                if not first_ns and carries_output(chunk):
                    first_ns = time.time_ns()
            sent.append(Sent(label, mode, trace_id, sent_ns, first_ns or time.time_ns()))
    return sent


def _wait_for_spans(collector: Collector, sent: Sequence[Sent], timeout_s: float = 60) -> None:
    """Until every request's spans are in (exporters send in batches, up to 5 s late)."""
    wanted = {(r.trace_id, "llm_request") for r in sent}
    wanted |= {(r.trace_id, "POST") for r in sent if r.server == "graph"}

    def done(spans: list[Span]) -> bool:
        names = {(s.trace_id, "POST" if s.name.startswith("POST ") else s.name) for s in spans}
        return wanted <= names

    collector.wait_for(None, done, timeout_s)
    time.sleep(6)  # the spans of other tiers, exported on their own schedule


def _quartiles(values: list[float]) -> str:
    if len(values) < 4:
        return f"{statistics.median(values):.1f}"
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return f"{q2:.1f} ({q1:.1f}–{q3:.1f})"


def _gap(gap_s: float) -> str:
    if not gap_s:
        return "each sent as the one before ended, "
    return f"each sent {gap_s * 1000:g} ms after the one before ended (the server idle), "


def report(args: argparse.Namespace, groups: Sequence[Breakdown]) -> str:
    argv = f"python -m bench.requests.ttft --requests {args.requests} --rounds {args.rounds}"
    argv += f" --gap-s {args.gap_s:g}" if args.gap_s else ""
    argv += "".join(f" --graph-arg {arg}" for arg in args.graph_arg)
    columns = [f"{g.server} {g.mode}" if g.server != g.mode else g.server for g in groups]
    names = [n for n in STAGE_ORDER if any(n in g.stages for g in groups)]
    out = [
        "# Time to first token, stage by stage: vLLM's server and the graph",
        "",
        f"Written by `{argv}` at commit {commit_id()}.",
        "",
        f"Host: {host_line()}. One streamed chat at a time (8 tokens, temperature 0, the "
        f"load of `bench.requests`), {_gap(args.gap_s)}{args.rounds} rounds of "
        f"{args.requests} per server "
        "and placement, the servers side by side, their blocks alternating and the one "
        "not measured stopped. Each request's own trace (vLLM's `llm_request` span on "
        "both, the graph's tier spans) and the client's clock split its TTFT; ms, "
        "median (interquartile range). The engine stage runs from vLLM's engine client "
        "taking the request to the first token back in that process.",
        "",
        "| stage | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name in names:
        cells = [_quartiles(g.stages[name]) if name in g.stages else "–" for g in groups]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    ttft = " | ".join(_quartiles(g.ttft_ms) for g in groups)
    whole = " | ".join(f"{len(g.ttft_ms)} of {len(g.ttft_ms) + g.missing}" for g in groups)
    out += [f"| **TTFT at the client** | {ttft} |", f"| requests traced whole | {whole} |"]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="per block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--gap-s", type=float, default=0.0, help="idle time before each request of a block"
    )
    parser.add_argument(
        "--graph-arg",
        action="append",
        default=[],
        help="KEY=VALUE a graph arg over the default graph's (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    graph_args = dict(arg.split("=", 1) for arg in args.graph_arg)
    load = ShortChats(model=str(TINY_MODEL), tokens=8)
    sent: list[Sent] = []
    with (
        tempfile.TemporaryDirectory(prefix="ttft-") as tmp,
        running_collector() as collector,
        requests_vllm(
            Path(tmp) / "vllm.log", ["--otlp-traces-endpoint", collector.endpoint]
        ) as vllm,
        graph_server(
            Path(tmp),
            dict(SERVE_ENV),
            [],
            graph_args={**graph_args, "observability.otlp_traces_endpoint": collector.endpoint},
        ) as graph,
    ):
        sides = [("vllm", "vllm", vllm, graph)]
        sides += [("graph", mode, graph, vllm) for mode in GRAPH_MODES]
        for label, mode, server, other in sides:  # warm-up, not kept
            with frozen(other):
                asyncio.run(_block(server, label, mode, load, 8))
        for round_ in range(args.rounds):
            for label, mode, server, other in sides if round_ % 2 == 0 else sides[::-1]:
                with frozen(other):
                    sent += asyncio.run(
                        _block(server, label, mode, load, args.requests, args.gap_s)
                    )
        _wait_for_spans(collector, sent)
        groups = breakdowns(sent, collector)
    text = report(args, groups)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
