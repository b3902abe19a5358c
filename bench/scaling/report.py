"""docs/autoscaling-signals.md and its plot from a ``bench.scaling`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt

from bench.scaling.study import DERENDER_NUM_CPUS, PHASES, SCALING, SIGNALS
from bench.stats import percentile


def phase_rows(run: dict[str, Any]) -> list[list[str]]:
    """One row per phase of a run: replicas, cores, requests, TPOT, tokens/s."""
    rows = []
    starts = run["phase_starts"]
    for index, phase in enumerate(PHASES):
        begin, end = starts[index], starts[index + 1]
        ticks = [k for k in run["ticks"] if begin < k["t_s"] <= end]
        requests = [r for r in run["requests"] if begin <= r["started_s"] < end]
        replicas = [k["replicas"] for k in ticks]
        cores = [k["cores"] for k in ticks]
        tpots = sorted(r["tpot_ms"] for r in requests if r["tpot_ms"] is not None)
        ok = [r for r in requests if r["ok"]]
        rows.append(
            [
                run["signal"],
                f"{index + 1}. {phase.name}",
                f"{sum(replicas) / len(replicas):.1f}" if replicas else "–",
                str(max(replicas, default=0)),
                str(replicas[-1]) if replicas else "–",
                f"{sum(cores) / len(cores):.2f}" if cores else "–",
                f"{len(ok)} / {len(requests) - len(ok)}",
                f"{percentile(tpots, 50):.1f}" if tpots else "–",
                f"{percentile(tpots, 95):.1f}" if tpots else "–",
                f"{sum(r['tokens'] for r in ok) / (end - begin):.0f}",
            ]
        )
    return rows


def plot(data: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for run in data["runs"]:
        ticks = run["ticks"]
        xs = [k["t_s"] for k in ticks]
        axes[0].step(xs, [k["replicas"] for k in ticks], where="post", label=run["signal"])
        axes[1].plot(xs, [k["cores"] for k in ticks], label=run["signal"])
        done = [r for r in run["requests"] if r["tpot_ms"] is not None]
        axes[2].scatter(
            [r["started_s"] for r in done], [r["tpot_ms"] for r in done], s=6, label=run["signal"]
        )
    # Phase lines of the first run (the runs' phases last about as long).
    for phase, t in zip(PHASES, data["runs"][0]["phase_starts"], strict=False):
        for ax in axes:
            ax.axvline(t, color="grey", lw=0.5)
        axes[0].text(t + 1, 0.03, phase.name, fontsize=8, transform=axes[0].get_xaxis_transform())
    axes[0].set_ylabel("Derender replicas")
    axes[1].set_ylabel("Derender cores used\n(starting replicas too)")
    axes[2].set_ylabel("TPOT ms (by start)")
    axes[2].set_yscale("log")
    axes[0].set_ylim(bottom=0)
    axes[2].set_xlabel("seconds")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(data: dict[str, Any], out: Path) -> None:
    image = out.with_suffix(".png")
    plot(data, image)
    phases = "; ".join(
        f"*{p.name}* {p.seconds:g} s"
        + (f": {p.streams} streams of {p.tokens} tokens" if p.streams else "")
        + (f", each engine step held {p.pace_ms:g} ms" if p.pace_ms else "")
        for p in PHASES
    )
    signals = "; ".join(
        f"`{name}`: " + ", ".join(f"{k} {v}" for k, v in opts.items())
        for name, opts in SIGNALS.items()
    )
    lines = [
        "# Derender on ongoing requests against Derender on its CPU",
        "",
        f"`python -m bench.scaling --out {out}`",
        "",
        f"Host: {data['host']}. One graph per signal, one after the other (`serve run`, tier "
        "text, the embedded model with the qwen3 reasoning and hermes tool parsers). "
        f"Derender: `num_cpus` {DERENDER_NUM_CPUS:g} (`configs/S.yaml`), "
        + ", ".join(f"{k} {v}" for k, v in SCALING.items())
        + f"; {signals} (`cores_per_replica`: its `num_cpus`). "
        f"Phases, closed loop, the same for both: {phases}. Each stream asks for a "
        "reasoning answer, `ignore_eos`.",
        "",
        "Replicas: Derender replica processes, starting ones included, sampled every "
        "second. Cores: what they used together over each second. TPOT: from a stream's "
        "first output chunk to its last, over its output tokens less one, by the phase "
        "it started in. A phase with load lasts until its last stream ends; the idle "
        "phase after it starts then. Tokens/s: output tokens of the streams that started "
        "in the phase and finished, over the phase's length.",
        "",
        "| signal | phase | replicas mean | max | at its end | Derender cores | "
        "streams ok / failed | TPOT p50 ms | TPOT p95 ms | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in data["runs"]:
        lines += ["| " + " | ".join(row) + " |" for row in phase_rows(run)]
    lines += ["", f"![replicas, cores and TPOT over time]({image.name})", ""]
    for run in data["runs"]:
        lines += ["", f"Serve's controller deciding Derender's replicas, `{run['signal']}`:", ""]
        lines += [f"- {t:g} s: {line}" for t, line in run.get("decisions", [])] or ["- none"]
    lines.append("")
    out.write_text("\n".join(lines))
