"""The report of ``bench.hostcpu``: per-run rows and the issue's targets as ratios."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from bench.harness.host import host_line

TIERS = ("Generate", "Derender", "Ingress", "proxy", "Render")
GRAPH_MODES = ("tokens", "inline", "tier")


@dataclass
class Result:
    mode: str
    tokens: int
    wall_s: float
    cpu_s: float
    """Every process of the server."""
    engine_core_s: float
    """vLLM's ``EngineCore`` processes: the scheduler, and a spin-wait on the model
    worker (``VLLM::Worker``, not counted here) that fills whatever CPU is idle."""
    steps: float
    """Engine steps taken for the load: fewer, fuller steps cost the engine core less."""
    tiers: dict[str, float]
    """CPU seconds per tier (the graph's replicas and proxy)."""

    def per_token_ms(self, cpu_s: float) -> float:
        return cpu_s / self.tokens * 1000

    @property
    def tokens_per_step(self) -> str:
        return f"{self.tokens / self.steps:.1f}" if self.steps else "–"

    @property
    def generate_host_s(self) -> float:
        return self.tiers.get("Generate", self.cpu_s)

    @property
    def generate_work_s(self) -> float:
        """The Generate host less its engine core: serving work and the model."""
        return self.generate_host_s - self.engine_core_s


def row(r: Result) -> str:
    tiers = " | ".join(f"{r.per_token_ms(r.tiers[t]):.2f}" if t in r.tiers else "–" for t in TIERS)
    return (
        f"| {r.mode} | {r.tokens} | {r.per_token_ms(r.cpu_s):.2f} "
        f"| {r.per_token_ms(r.generate_host_s):.2f} | {r.per_token_ms(r.engine_core_s):.2f} "
        f"| {r.per_token_ms(r.generate_work_s):.2f} "
        f"| {r.tokens_per_step} | {tiers} | {r.wall_s:.1f} |"
    )


def _ratio(results: dict[str, Result], a: str, b: str, of: Callable[[Result], float]) -> str:
    if a not in results or b not in results:
        return "–"
    return f"{of(results[a]) / of(results[b]):.2f}×"


def targets(results: list[Result], label: str) -> list[str]:
    """The issue's targets, as ratios between rows of this run."""
    by = {r.mode: r for r in results}
    p = f"{label} " if label else ""

    def total(r: Result) -> float:
        return r.cpu_s / r.tokens

    def host(r: Result) -> float:
        return r.generate_host_s / r.tokens

    def work(r: Result) -> float:
        return r.generate_work_s / r.tokens

    def tiers(r: Result) -> float:
        return sum(r.tiers.values()) / r.tokens

    def wall(r: Result) -> float:
        return r.wall_s

    rows = [
        ("graph CPU/token, inline ÷ vLLM", f"{p}inline", "vllm", total, "≤ 1.2×"),
        ("graph CPU/token, tier ÷ vLLM", f"{p}tier", "vllm", total, "≤ 1.35×"),
        ("Generate host CPU/token, tier ÷ tokens", f"{p}tier", f"{p}tokens", host, "≤ 1.05×"),
        ("Generate host CPU/token, tier ÷ inline", f"{p}tier", f"{p}inline", host, "≤ 0.85×"),
        (
            "Generate host less engine core, CPU/token, tier ÷ inline",
            f"{p}tier",
            f"{p}inline",
            work,
            "(≤ 0.85×)",
        ),
        ("all tiers CPU/token, tier ÷ inline", f"{p}tier", f"{p}inline", tiers, "≤ 1.15×"),
        ("wall, inline ÷ vLLM", f"{p}inline", "vllm", wall, "≤ 1.1×"),
        ("wall, tier ÷ vLLM", f"{p}tier", "vllm", wall, "≤ 1.1×"),
    ]
    return [
        f"| {label or 'default'} | {name} | {_ratio(by, a, b, of)} | {goal} |"
        for name, a, b, of, goal in rows
    ]


def report(args: argparse.Namespace, results: list[Result], labels: list[str]) -> str:
    head = (
        "| run | tokens | CPU ms/token, all processes | Generate host | of which engine core | "
        "Generate host less engine core | tokens/step | " + " | ".join(TIERS) + " | wall s |"
    )
    lines = [
        "# Host CPU per output token: vLLM's server and the graph",
        "",
        f"`{' '.join(['python -m bench.hostcpu', *sys.argv[1:]])}`",
        "",
        f"Host: {host_line()}; {args.streams} chat streams "
        f"of {args.tokens} tokens at once ({args.traffic} traffic: `bench/hostcpu/study.py`), "
        f"engine step held {args.pace_ms:g} ms; "
        f"one Generate and one Derender replica; each row warmed up, then run "
        f"{args.repeat} time(s) (graph modes in turn), CPU and tokens summed.",
        "",
        "*vllm*: its server measured before and after the graph rows, and both together "
        "(CPU and tokens summed, wall averaged), which the targets use"
        + (
            f"; its engine processes bound to core(s) {args.vllm_engine_cores} once up, as "
            "the graph binds its own. "
            if getattr(args, "vllm_engine_cores", None)
            else ". "
        )
        + "CPU milliseconds per output token. *All processes*: vLLM's server and its engine "
        "core; for the graph, every process under `serve run` (Ray's own included). "
        "*Generate host*: vLLM's whole server, or the graph's Generate replica with its "
        "engine processes; *engine core*: vLLM's `VLLM::EngineCore` process alone "
        "(scheduler, no serving work, no model: the model runs in `VLLM::Worker`); "
        "*less engine core*: the Generate host without it, i.e. serving work and the "
        "model; *tokens/step*: output tokens per engine step (the count of vLLM's "
        "`vllm:iteration_tokens_total`; equal steps mean equal model and scheduler work). "
        "The tier columns are the graph's replica process trees and Serve's proxy actor "
        "(idle behind HAProxy, which carries the traffic and counts in all processes).",
        "",
        "**Why the engine core column moves between rows.** On CPU, vLLM's engine core "
        "waits for its worker's step in a spin loop (`shm_broadcast.SpinCondition.wait`: "
        "`sched_yield` for 1 s after each read), so through the whole 15 ms step it "
        "burns whatever CPU the other processes leave idle: a py-spy profile of it "
        "under this load put 82–83% of its samples (inline and tier alike) in that "
        "wait. Its CPU time therefore "
        "falls when the serving processes are busier, and the literal Generate-host "
        "ratio favours the placement that does more work on the host. The target row "
        "in parentheses leaves the engine core out, with the same steps in every row "
        "(tokens/step), so it compares the work the placement changes.",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
        *(row(r) for r in results),
        "",
        "Targets (issue 13), as ratios between rows of this run:",
        "",
        "| graph | ratio | measured | target |",
        "|---|---|---|---|",
    ]
    for label in labels:
        lines += targets(results, label)
    if len(labels) > 1:
        lines += ["", *variants(results, labels)]
    return "\n".join(lines) + "\n"


def variants(results: list[Result], labels: list[str]) -> list[str]:
    """Each ``--variant`` against the default graph, mode by mode: the default's CPU
    per token ÷ the variant's, with and without the engine core (whose spin-wait
    takes what the serving processes leave idle: ``report``)."""
    by = {r.mode: r for r in results}

    def total(r: Result) -> float:
        return r.cpu_s / r.tokens

    def serving(r: Result) -> float:
        return (r.cpu_s - r.engine_core_s) / r.tokens

    lines = [
        "The default graph against each variant, CPU per token (default ÷ variant):",
        "",
        "| variant | mode | all processes | all processes less engine core |",
        "|---|---|---|---|",
    ]
    for label in labels[1:]:
        for mode in GRAPH_MODES:
            if mode in by and f"{label} {mode}" in by:
                a, b = mode, f"{label} {mode}"
                lines.append(
                    f"| {label} | {mode} | {_ratio(by, a, b, total)} | "
                    f"{_ratio(by, a, b, serving)} |"
                )
    return lines
