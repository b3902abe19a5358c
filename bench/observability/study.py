"""``python -m bench.observability``: where a request's time goes, read back from a
real Prometheus, not from the client.

It starts the graph (the embedded default, with the product's Serve switches) and
Debian's Prometheus scraping the graph's ``/metrics`` every second, then runs one
phase per placement: streamed chats of the load ``bench.requests`` sends (temperature 0,
``ignore_eos``, reasoning and plain prompts in turn, the qwen3 and hermes parsers on),
``--concurrency`` clients in a closed loop, ``X-Text-Placement`` set. Phases are apart
by ``SETTLE_S`` of quiet, longer than Ray's agents take to pass a value on (10 s) plus a
scrape, so each phase is read over its own window: every hop's quantiles from its
histogram's increase over the window. The client's own timings are kept beside them.

Then the Grafana dashboard (``k8s/monitoring/grafana-dashboard.json``) is drawn from
the same Prometheus over the whole run, one plot per panel, each of its queries as
Grafana would run it (``report.draw_dashboard``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.harness.prometheus import Prometheus, running_prometheus
from bench.harness.servers import running_graph
from bench.observability.observe_cost import observe_cost_us
from bench.observability.report import DASHBOARD, draw_dashboard, report
from bench.observe import graph_workers
from bench.requests.load import ShortChats, closed_loop
from deployments.config.graph_config import EMBEDDED_DEFAULT, TINY_MODEL

SETTLE_S = 15.0
# Every histogram of deployments/observability/metrics.py.
HISTOGRAMS = (
    "unary_call_seconds",
    "first_item_seconds",
    "inter_item_seconds",
    "step_channel_batch_items",
    "step_channel_wait_seconds",
    "prefix_matched_blocks",
)
JOB = "graph"
APP = "default"


@dataclass
class Hop:
    """One figure of a phase as Prometheus has it: a quantile of a histogram over
    the phase's window, or a ratio of two counters' increases."""

    name: str
    where: str
    """The deployment (or vLLM's engine) that measured it."""
    expression: str
    value: float | None = None


@dataclass
class Phase:
    placement: str
    start: float
    end: float
    requests: int
    tokens: int = 0
    replica_cpu_s: float = 0.0
    """CPU of the graph's replica processes themselves (not the engines under
    Generate, not Ray's own): where the metrics are recorded."""
    client_ttft_ms: list[float] = field(default_factory=list)
    client_e2e_ms: list[float] = field(default_factory=list)
    hops: list[Hop] = field(default_factory=list)


def _quantile(q: float, family: str, labels: str, window_s: int) -> str:
    return (
        f"histogram_quantile({q}, sum by (le) (increase({family}_bucket"
        f'{{job="{JOB}",{labels}}}[{window_s}s])))'
    )


def _increase(family: str, window_s: int) -> str:
    return f'sum(increase({family}{{job="{JOB}",application="{APP}"}}[{window_s}s]))'


def hops(placement: str, window_s: int) -> list[Hop]:
    """What each phase is read for, in the order a request crosses the graph."""
    ours = f'application="{APP}"'
    engines = 'replica=~".+"'
    callee = "Generate" if placement == "inline" else "Derender"
    first = f'{ours},callee="{callee}",kind="stream"'
    # (name, measured by, quantile, family, labels)
    quantiles = [
        ("render (chat_text)", "Render", 0.5, "ray_scaleout_unary_call_seconds",
         f'{ours},deployment="Render",method="chat_text"'),
        ("call to first item back", "Ingress", 0.5, "ray_scaleout_first_item_seconds", first),
        ("call to first item back, p95", "Ingress", 0.95, "ray_scaleout_first_item_seconds",
         first),
        ("time to first token", "vLLM engine", 0.5, "vllm:time_to_first_token_seconds",
         engines),
        ("inter-token latency", "vLLM engine", 0.5, "vllm:inter_token_latency_seconds",
         engines),
    ]  # fmt: skip
    tiers = ["Generate", "Derender", "Ingress"] if placement == "tier" else ["Generate", "Ingress"]
    for tier in tiers:
        quantiles.append(("inter-item time", tier, 0.5, "ray_scaleout_inter_item_seconds",
                          f'{ours},deployment="{tier}"'))  # fmt: skip
    if placement == "tier":
        for tier in ("Generate", "Derender"):  # a channel's sending side
            labels = f'{ours},deployment="{tier}"'
            quantiles += [
                ("step channel batch, items", tier, 0.5,
                 "ray_scaleout_step_channel_batch_items", labels),
                ("step channel wait, p95", tier, 0.95,
                 "ray_scaleout_step_channel_wait_seconds", labels),
            ]  # fmt: skip
    out = [Hop(name, where, _quantile(q, family, labels, window_s))
           for name, where, q, family, labels in quantiles]  # fmt: skip
    # vLLM's queue and prefill buckets start at 0.3 s: a quantile under it reads the
    # bucket's middle. Their means, from the sums and counts, say more.
    for name, family in (
        ("prefill, mean", "vllm:request_prefill_time_seconds"),
        ("queue, mean", "vllm:request_queue_time_seconds"),
    ):  # after first items
        total = f'sum(increase({family}_sum{{job="{JOB}"}}[{window_s}s]))'
        count = f'sum(increase({family}_count{{job="{JOB}"}}[{window_s}s]))'
        out.insert(3, Hop(name, "vLLM engine", f"{total} / {count}"))
    # One family at a time: increase() over several names would drop the names and
    # clash; a family with no series counts 0.
    observations = " + ".join(
        f"({_increase(f'ray_scaleout_{family}_count', window_s)} or vector(0))"
        for family in HISTOGRAMS
    )
    tokens = f'sum(increase(vllm:generation_tokens_total{{job="{JOB}"}}[{window_s}s]))'
    out.append(Hop("histogram observations per output token", "every tier",
                   f"({observations}) / {tokens}"))  # fmt: skip
    if placement == "tier":
        cpu = _increase("ray_scaleout_derender_cpu_seconds_total", window_s)
        tokens = _increase("ray_scaleout_derender_tokens_total", window_s)
        out.append(Hop("CPU per token", "Derender", f"{cpu} / {tokens}"))
    return out


def read_phase(prometheus: Prometheus, phase: Phase) -> None:
    """Every hop of ``phase`` over its window, once its last values are in."""
    at = phase.end + SETTLE_S
    window_s = int(at - phase.start) + 1
    phase.hops = hops(phase.placement, window_s)
    for hop in phase.hops:
        hop.value = prometheus.value(hop.expression, at)


def replica_cpu_s(port: int) -> float:
    """CPU seconds so far of the graph's Ray workers (its replicas, Serve's proxy)."""
    total = 0.0
    for process in graph_workers(port):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def run_phase(base_url: str, placement: str, args: argparse.Namespace) -> Phase:
    load = ShortChats(str(TINY_MODEL), args.tokens)
    headers = {"X-Text-Placement": placement}
    port = int(base_url.rsplit(":", 1)[1])
    cpu_before, start = replica_cpu_s(port), time.time()
    timings, _ = asyncio.run(closed_loop(base_url, load, args.concurrency, args.requests, headers))
    phase = Phase(placement, start, time.time(), len(timings), len(timings) * args.tokens)
    phase.replica_cpu_s = replica_cpu_s(port) - cpu_before
    phase.client_ttft_ms = [t.ttft_s * 1000 for t in timings]
    phase.client_e2e_ms = [t.e2e_s * 1000 for t in timings]
    print(f"{placement}: {len(timings)} chats in {phase.end - start:.1f} s", flush=True)
    return phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per chat")
    parser.add_argument("--requests", type=int, default=120, help="chats per placement")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--placements", default="inline,tier")
    parser.add_argument("--out", type=Path, required=True, help="folder for the report")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    apps = {APP: ("/", dict(EMBEDDED_DEFAULT))}
    with tempfile.TemporaryDirectory(prefix="observability-") as tmp:
        work = Path(tmp)
        (work / "graph").mkdir()
        (work / "prometheus").mkdir()
        with running_graph(work / "graph", apps) as graph:
            port = graph.base_url.rsplit(":", 1)[1]
            scrape = [{"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
            with running_prometheus(work / "prometheus", scrape) as prometheus:
                # One short warm-up per placement, left out of every window.
                warm = argparse.Namespace(**{**vars(args), "requests": args.concurrency})
                for placement in args.placements.split(","):
                    run_phase(graph.base_url, placement, warm)
                time.sleep(SETTLE_S)
                run_start = time.time()
                phases = []
                for placement in args.placements.split(","):
                    phases.append(run_phase(graph.base_url, placement, args))
                    time.sleep(SETTLE_S)
                for phase in phases:
                    read_phase(prometheus, phase)
                run_end = time.time()
                image = args.out / "dashboard.png"
                draw_dashboard(prometheus, DASHBOARD, run_start, run_end, image, JOB, APP)
    # After the graph: a local Ray of its own measures one observation's cost.
    results: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)},
                               "phases": [asdict(p) for p in phases],
                               "observe_cost_us": observe_cost_us()}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = report(results)
    (args.out / "breakdown.md").write_text(text)
    print(text)
