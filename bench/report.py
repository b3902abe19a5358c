"""A results directory → the seed's table (markdown), CSV and PNG plots.

Everything here is computed from ``cells.json``, ``spec.json`` and
``timeline.json`` as the run wrote them; nothing is typed in.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server
import matplotlib.pyplot as plt

TOPOLOGY_NAMES = {
    "G": "G (gen only)",
    "T": "T (inline text)",
    "B": "B (derender, parsed)",
    "BP": "BP (derender, plain)",
    "S": "S (stateful tier)",
    "I": "I (inline parsed)",
}


def load(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    spec = json.loads((out / "spec.json").read_text())
    cells = json.loads((out / "cells.json").read_text())
    timeline_path = out / "timeline.json"
    timeline = json.loads(timeline_path.read_text()) if timeline_path.exists() else {}
    return spec, cells, timeline


def _ms(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def cell_text(cell: dict[str, Any] | None) -> str:
    """``TTFT p50/p95 | TPOT p50/p95`` in ms, as the seed writes it (``|`` escaped)."""
    if cell is None:
        return "n/a"
    if not cell["drained"]:
        return "did not drain"
    text = (
        f"{_ms(cell['ttft_p50_ms'], 0)}/{_ms(cell['ttft_p95_ms'], 0)} \\| "
        f"{_ms(cell['tpot_p50_ms'], 2)}/{_ms(cell['tpot_p95_ms'], 2)}"
    )
    if cell["errors"]:
        text += f" ({cell['errors']} failed)"
    return text


def grid_table(
    spec: dict[str, Any],
    cells: list[dict[str, Any]],
    text: Callable[[dict[str, Any] | None], str],
) -> str:
    """One row per (shape, rate), one column per topology the run reached, each
    cell written by ``text`` (given None where the run has no such cell)."""
    by_key = {(c["topology"], c["shape"], c["rps"]): c for c in cells}
    topologies = [t for t in spec["topologies"] if any(c["topology"] == t for c in cells)]
    header = ["shape @ rps", *(TOPOLOGY_NAMES.get(t, t) for t in topologies)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for shape in spec["shapes"]:
        for rps in spec["rps"]:
            row = [f"{shape} @{rps:g}"]
            row += [text(by_key.get((t, shape, rps))) for t in topologies]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def markdown_table(spec: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    """The seed's table: ``TTFT p50/p95 | TPOT p50/p95`` per cell."""
    return grid_table(spec, cells, cell_text)


def load_table(cells: list[dict[str, Any]]) -> str:
    """Per cell: requests done, output tokens/s, CPU seconds per tier."""
    tiers = sorted({tier for c in cells for tier in c["cpu_s"]})
    header = ["topology", "shape @ rps", "done/sent", "out tok/s", *(f"CPU s {t}" for t in tiers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in cells:
        row = [
            c["topology"],
            f"{c['shape']} @{c['rps']:g}",
            f"{c['completed']}/{c['requests']}",
            f"{c['output_tokens_per_s']:.0f}",
            *(f"{c['cpu_s'].get(t, 0.0):.1f}" for t in tiers),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def cpu_per_1k_text(cell: dict[str, Any] | None) -> str:
    """CPU seconds per 1,000 output tokens, ``Generate / all tiers`` (Generate with
    its engine; all tiers: every replica and Serve's proxy)."""
    tokens = cell["output_tokens_per_s"] * cell["wall_s"] if cell else 0.0
    if cell is None or tokens < 1:
        return "–"
    per_1k = 1000 / tokens
    generate = cell["cpu_s"].get("Generate", 0.0) * per_1k
    return f"{generate:.1f} / {sum(cell['cpu_s'].values()) * per_1k:.1f}"


def cpu_per_1k_table(spec: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    return grid_table(spec, cells, cpu_per_1k_text)


def write_csv(cells: list[dict[str, Any]], path: Path) -> None:
    tiers = sorted({tier for c in cells for tier in c["cpu_s"]})
    fields = [k for k in cells[0] if k != "cpu_s"] if cells else []
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*fields, *(f"cpu_s_{t}" for t in tiers)])
        for c in cells:
            writer.writerow([c[k] for k in fields] + [c["cpu_s"].get(t, 0.0) for t in tiers])


def plot_latency(spec: dict[str, Any], cells: list[dict[str, Any]], path: Path) -> None:
    """TTFT p50 and TPOT p50 against rps: one column per shape, one line per topology."""
    shapes = spec["shapes"]
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.5 * len(shapes), 7), squeeze=False)
    for col, shape in enumerate(shapes):
        for row, (metric, label) in enumerate(
            [("ttft_p50_ms", "TTFT p50 (ms)"), ("tpot_p50_ms", "TPOT p50 (ms)")]
        ):
            ax = axes[row][col]
            for number, topology in enumerate(spec["topologies"]):
                points = sorted(
                    (c["rps"], c[metric])
                    for c in cells
                    if c["topology"] == topology and c["shape"] == shape
                    and c["drained"] and c[metric] is not None
                )  # fmt: skip
                if points:
                    xs, ys = zip(*points, strict=True)
                    # One color per topology in every panel, even where one has no points.
                    ax.plot(xs, ys, marker="o", label=topology, color=f"C{number}")
            ax.set_title(f"{shape}: {label}")
            ax.set_xlabel("rps")
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_replicas(timeline: dict[str, Any], path: Path, ramp: list[dict[str, float]]) -> None:
    """Replica count of each deployment over time, one panel per topology run;
    for a ramp, the offered rate on a second axis."""
    runs = timeline.get("samples", [])
    if not runs:
        return
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        ((topology, samples),) = run.items()
        deployments = sorted({k for s in samples for k in s if k != "t_s"})
        for deployment in deployments:
            ax.step(
                [s["t_s"] for s in samples],
                [s.get(deployment, 0) for s in samples],
                where="post",
                label=deployment,
            )
        for cell in timeline.get("cells", []):
            if cell["topology"] != topology:
                continue
            ax.axvspan(cell["start_s"], cell["end_s"], alpha=0.08)
            if ramp:
                edges = [cell["start_s"]]
                for phase in ramp:
                    edges.append(edges[-1] + phase["seconds"])
                rates = [phase["rps"] for phase in ramp]
                rate_ax = ax.twinx()
                rate_ax.step(edges, [*rates, rates[-1]], where="post", color="gray",
                             linestyle="--", label="offered rps")  # fmt: skip
                rate_ax.set_ylabel("offered rps")
                rate_ax.legend(loc="upper right", fontsize="small")
        ax.set_title(f"{topology}: replicas per deployment (shaded: cells)")
        ax.set_xlabel("s")
        ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out: Path) -> str:
    """Writes table.md, cells.csv, latency.png, replicas.png; returns the markdown."""
    spec, cells, timeline = load(out)
    table = markdown_table(spec, cells)
    text = (
        "TTFT p50/p95 | TPOT p50/p95 (ms)\n\n" + table
        + "\nRequests, throughput and CPU per tier\n\n" + load_table(cells)
        + "\nCPU s per 1k output tokens, Generate / all tiers\n\n"
        + cpu_per_1k_table(spec, cells)
    )  # fmt: skip
    (out / "table.md").write_text(text)
    write_csv(cells, out / "cells.csv")
    plot_latency(spec, cells, out / "latency.png")
    plot_replicas(timeline, out / "replicas.png", spec["ramp"])
    return text
