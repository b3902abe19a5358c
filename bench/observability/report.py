"""The report of ``bench.observability``: each phase's hops as Prometheus read them,
and the Grafana dashboard drawn from the same data."""

from __future__ import annotations

import json
import math
import platform
import statistics
from pathlib import Path
from typing import Any

import psutil

from bench.harness.prometheus import Prometheus
from bench.requests.report import commit_id
from deployments.config.graph_config import REPO_ROOT

DASHBOARD = REPO_ROOT / "k8s/monitoring/grafana-dashboard.json"
# What Grafana's $__rate_interval comes to for a 1 s scrape and a short run.
RATE_INTERVAL = "15s"
STEP_S = 2.0


def _ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value * 1000:.1f}"


def _hop_value(hop: dict[str, Any]) -> str:
    value = hop["value"]
    if value is None or math.isnan(value):
        return "–"
    if "per output token" in hop["name"]:
        return f"{value:.2f}"
    return f"{value:.1f} items" if "items" in hop["name"] else f"{_ms(value)} ms"


def cost_section(results: dict[str, Any]) -> list[str]:
    """What recording the metrics cost in this run: observations per token (read from
    Prometheus) × one observation's cost (measured in a Serve replica), against the
    CPU the graph's replica processes spent per token."""
    rounds = results["observe_cost_us"]
    cost_us = statistics.median(rounds)
    lines = [
        "## What recording them cost",
        "",
        f"One observation, timed in a Serve replica through `graph_metrics()` "
        f"({len(rounds)} rounds): {cost_us:.1f} µs (rounds {min(rounds):.1f}–"
        f"{max(rounds):.1f}). Against the CPU the graph's Ray workers themselves (replicas "
        "and Serve's proxy, not the engines under Generate, not Ray's own processes) spent "
        "per output token in each phase:",
        "",
        "| phase | histogram observations per token | replica CPU per token | "
        "observations' share |",
        "|---|---|---|---|",
    ]
    for phase in results["phases"]:
        per_token = next(
            (h["value"] for h in phase["hops"] if h["name"].startswith("histogram obs")), None
        )
        if per_token is None or math.isnan(per_token) or not phase["tokens"]:
            continue
        cpu_us = phase["replica_cpu_s"] / phase["tokens"] * 1e6
        share = per_token * cost_us / cpu_us
        lines.append(f"| {phase['placement']} | {per_token:.2f} | {cpu_us:.0f} µs | {share:.1%} |")
    return lines


def report(results: dict[str, Any]) -> str:
    args = results["args"]
    lines = [
        "# Where a request's time goes, read back from Prometheus",
        "",
        f"Written by `python -m bench.observability --tokens {args['tokens']} --requests "
        f"{args['requests']} --concurrency {args['concurrency']} --placements "
        f"{args['placements']} --out {args['out']}` at commit {commit_id()}.",
        "",
        f"Host: {platform.machine()}, {psutil.cpu_count()} CPUs. The graph: the embedded "
        "default (qwen3 reasoning and hermes tool parsers), the product's Serve switches. "
        f"Load: streamed chats of {args['tokens']} tokens (`bench.requests`' prompts, "
        f"temperature 0, `ignore_eos`), {args['concurrency']} clients in a closed loop, "
        f"{args['requests']} chats per placement. Prometheus (Debian's) scraped the graph's "
        "`/metrics` every second; each figure is a quantile of a histogram's increase over "
        "its phase (p50 unless named), read once the phase's last values had reached "
        "Ray's agents. The client's TTFT is to the first chunk with output.",
        "",
    ]
    phases = results["phases"]
    for phase in phases:
        ttft = statistics.median(phase["client_ttft_ms"])
        e2e = statistics.median(phase["client_e2e_ms"])
        lines += [
            f"## {phase['placement']}",
            "",
            f"{phase['requests']} chats in {phase['end'] - phase['start']:.1f} s; the client "
            f"saw TTFT p50 {ttft:.1f} ms, end to end p50 {e2e:.1f} ms.",
            "",
            "| hop | measured by | value |",
            "|---|---|---|",
            *(f"| {h['name']} | {h['where']} | {_hop_value(h)} |" for h in phase["hops"]),
            "",
        ]
    lines += [*cost_section(results), ""]
    lines += [
        "## The dashboard over this run",
        "",
        "`k8s/monitoring/grafana-dashboard.json`, each panel's queries run on this "
        f"Prometheus over the whole run (`$__rate_interval` = {RATE_INTERVAL}, a point "
        f"every {STEP_S:g} s) and plotted: the phases in order, "
        f"{', '.join(p['placement'] for p in phases)}.",
        "",
        "![dashboard](dashboard.png)",
        "",
    ]
    return "\n".join(lines)


Panel = tuple[str, list[tuple[str, str]]]


def panel_queries(
    dashboard: Path, job: str, application: str, rate_interval: str = RATE_INTERVAL
) -> list[Panel]:
    """Each panel's title and its (legend, query), variables set as Grafana sets them."""
    panels = json.loads(dashboard.read_text())["panels"]
    out = []
    for panel in panels:
        targets = []
        for target in panel["targets"]:
            expression = (
                target["expr"]
                .replace("$job", job)
                .replace("$application", application)
                .replace("$__rate_interval", rate_interval)
            )
            targets.append((target.get("legendFormat", ""), expression))
        out.append((panel["title"], targets))
    return out


def _legend(template: str, labels: dict[str, str]) -> str:
    text = template
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def draw_dashboard(
    prometheus: Prometheus,
    dashboard: Path,
    start: float,
    end: float,
    image: Path,
    job: str,
    application: str,
) -> None:
    """The dashboard's panels as one image, from range queries over ``start``–``end``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panel_queries(dashboard, job, application)
    rows = math.ceil(len(panels) / 2)
    figure, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    for axis, (title, targets) in zip(axes.flat, panels, strict=False):
        for legend, expression in targets:
            for series in prometheus.query_range(expression, start, end, STEP_S):
                points = [
                    (float(t) - start, float(v))
                    for t, v in series["values"]
                    if not math.isnan(float(v))
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    axis.plot(xs, ys, label=_legend(legend, series["metric"]) or expression[:40])
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("s into the run", fontsize=8)
        axis.tick_params(labelsize=8)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="upper right")
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(image, dpi=80)
    plt.close(figure)
