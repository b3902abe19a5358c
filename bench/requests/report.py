"""The report of ``bench.requests``: cells, CPU by process, idle cost, memory, targets."""

from __future__ import annotations

import argparse
import operator
import statistics
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from bench.harness.host import host_line
from bench.requests.engine_view import engine_table
from bench.requests.figures import (
    concurrencies,
    cpu_ms,
    e2e_p50,
    modes,
    rounds,
    rps,
    spread,
    ttft_p50,
    ttft_p95,
)
from bench.requests.processes import KINDS
from bench.startup import revision
from deployments.config.graph_config import REPO_ROOT as REPO

if TYPE_CHECKING:
    from bench.requests.study import Cell, ServerRun

# Issue 27's targets: graph ÷ vLLM per request, by placement.
CPU_TARGET = {"inline": 1.3, "tier": 1.4}
RPS_TARGET = 0.8
TTFT_EXTRA_MS = 15.0
IDLE_EXTRA_CORE = 0.05


def cells_table(runs: Sequence[ServerRun]) -> list[str]:
    lines = [
        "| server | text | concurrency | requests/s | TTFT p50 ms | TTFT p95 ms | e2e p50 ms "
        "| CPU ms/request, all processes | without the engine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for concurrency in concurrencies(runs):
            for mode in modes(run):
                cells = rounds(run, mode, concurrency)
                if not cells:
                    continue
                figures = [
                    spread([rps(c) for c in cells], ".1f"),
                    spread([ttft_p50(c) for c in cells]),
                    spread([ttft_p95(c) for c in cells]),
                    spread([e2e_p50(c) for c in cells]),
                    spread([cpu_ms(c) for c in cells]),
                    spread([cpu_ms(c, engine=False) for c in cells]),
                ]
                text = "–" if mode == "vllm" else mode
                lines.append(f"| {run.label} | {text} | {concurrency} | {' | '.join(figures)} |")
    return lines


def by_kind_table(runs: Sequence[ServerRun], concurrency: int) -> list[str]:
    kinds = [k for k in KINDS if any(k in c.cpu_s for r in runs for c in r.cells)]
    lines = [
        "| server | text | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for run in runs:
        for mode in modes(run):
            cells = rounds(run, mode, concurrency)
            if not cells:
                continue
            figures = []
            for kind in kinds:
                values = [c.cpu_s.get(kind, 0.0) / c.requests * 1000 for c in cells]
                figures.append(f"{statistics.median(values):.1f}" if any(values) else "–")
            text = "–" if mode == "vllm" else mode
            lines.append(f"| {run.label} | {text} | " + " | ".join(figures) + " |")
    return lines


def idle_table(runs: Sequence[ServerRun]) -> list[str]:
    kinds = [k for k in KINDS if any(k in r.idle_core_share for r in runs)]
    lines = [
        "| server | all | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for run in runs:
        share = run.idle_core_share
        figures = [f"{share[k] * 100:.1f}" if k in share else "–" for k in kinds]
        total = sum(share.values()) * 100
        lines.append(f"| {run.label} | **{total:.1f}** | " + " | ".join(figures) + " |")
    return lines


def memory_table(runs: Sequence[ServerRun]) -> list[str]:
    lines = [
        "| server | kind | processes | RSS MiB | USS MiB |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        for kind in KINDS:
            if (m := run.memory.get(kind)) is not None:
                lines.append(
                    f"| {run.label} | {kind} | {m.processes} | {m.rss_mib:.0f} | {m.uss_mib:.0f} |"
                )
        procs = sum(m.processes for m in run.memory.values())
        rss = sum(m.rss_mib for m in run.memory.values())
        uss = sum(m.uss_mib for m in run.memory.values())
        lines.append(f"| {run.label} | **all** | {procs} | {rss:.0f} | {uss:.0f} |")
    return lines


def _paired(
    graph: ServerRun,
    vllm: ServerRun,
    mode: str,
    concurrency: int,
    of: Callable[[Cell, Cell], float],
) -> list[float]:
    """``of(graph cell, vLLM cell)`` for each round both ran."""
    ours = {c.round: c for c in rounds(graph, mode, concurrency)}
    theirs = {c.round: c for c in rounds(vllm, "vllm", concurrency)}
    return [of(ours[r], theirs[r]) for r in sorted(ours.keys() & theirs.keys())]


def _met(values: Sequence[float], ok: Callable[[float], bool]) -> str:
    """Met in every round, by the median only, or not."""
    if all(ok(v) for v in values):
        return "yes"
    return "median only" if ok(statistics.median(values)) else "no"


def targets_table(runs: Sequence[ServerRun]) -> list[str]:
    vllm = next((r for r in runs if r.label == "vllm"), None)
    if vllm is None:
        return ["(vLLM's server was not run: no ratios.)"]
    lines = [
        "| graph | target | measured: median (rounds' spread) | met |",
        "|---|---|---|---|",
    ]

    def add(
        label: str, target: str, values: list[float], ok: Callable[[float], bool], fmt: str
    ) -> None:
        if values:
            lines.append(f"| {label} | {target} | {spread(values, fmt)} | {_met(values, ok)} |")

    for run in runs:
        if run is vllm:
            continue
        for mode in modes(run):
            limit = CPU_TARGET[mode]
            for concurrency in concurrencies(runs):
                ratios = _paired(run, vllm, mode, concurrency, lambda g, v: cpu_ms(g) / cpu_ms(v))
                add(
                    run.label,
                    f"CPU/request {mode} ÷ vLLM, concurrency {concurrency}: ≤ {limit}×",
                    ratios,
                    partial(operator.ge, limit),
                    ".2f",
                )
            high = max(concurrencies(runs))
            add(
                run.label,
                f"requests/s {mode} ÷ vLLM, concurrency {high}: ≥ {RPS_TARGET}×",
                _paired(run, vllm, mode, high, lambda g, v: rps(g) / rps(v)),
                lambda x: x >= RPS_TARGET,
                ".2f",
            )
            low = min(concurrencies(runs))
            add(
                run.label,
                f"TTFT p50 {mode} − vLLM's, concurrency {low}: ≤ {TTFT_EXTRA_MS:.0f} ms",
                _paired(run, vllm, mode, low, lambda g, v: ttft_p50(g) - ttft_p50(v)),
                lambda x: x <= TTFT_EXTRA_MS,
                ".0f",
            )
        idle = sum(run.idle_core_share.values()) - sum(vllm.idle_core_share.values())
        add(
            run.label,
            f"idle CPU − vLLM's idle: ≤ {IDLE_EXTRA_CORE * 100:.0f}% of a core",
            [idle * 100],
            lambda x: x <= IDLE_EXTRA_CORE * 100,
            ".1f",
        )
    return lines


def variants_table(runs: Sequence[ServerRun]) -> list[str]:
    """``make-run`` against each ``--variant`` round by round: CPU per request, all
    processes and without the engine (whose spin-wait grows with wall time)."""
    base = next((r for r in runs if r.label == "make-run"), None)
    others = [r for r in runs if r.label not in ("vllm", "plain", "make-run", *FLOORS)]
    if base is None or not others:
        return []
    lines = [
        "| variant | text | concurrency | CPU/request, make-run ÷ variant | without the engine |",
        "|---|---|---|---|---|",
    ]
    for run in others:
        for mode in modes(run):
            for concurrency in concurrencies(runs):
                ours = {c.round: c for c in rounds(base, mode, concurrency)}
                theirs = {c.round: c for c in rounds(run, mode, concurrency)}
                both = sorted(ours.keys() & theirs.keys())
                if not both:
                    continue
                total = [cpu_ms(ours[r]) / cpu_ms(theirs[r]) for r in both]
                serving = [
                    cpu_ms(ours[r], engine=False) / cpu_ms(theirs[r], engine=False) for r in both
                ]
                lines.append(
                    f"| {run.label} | {mode} | {concurrency} | {spread(total, '.3f')} | "
                    f"{spread(serving, '.3f')} |"
                )
    return lines


def commit_id() -> str:
    return revision(REPO)


FLOORS = ("floor", "floor-min")
"""Serve's floor for the graph's shape (``floor_app``), as it streams and at its least."""
FLOOR_ENGINE = "floor-engine"
"""The least floor with vLLM's engine behind it: measured against the targets as is."""


def floor_table(runs: Sequence[ServerRun], label: str = "floor") -> list[str]:
    """The least each CPU target allows the graph, from Serve's floor ``label``.

    A graph of this shape spends at least the floor (Serve's edge, handles and Ray,
    with no vLLM) plus the engine's CPU (vLLM's, at vLLM's own request rate: a slower
    graph spins its engine longer), even if all of vLLM's serving work were free. Round
    by round, that bound ÷ vLLM's CPU per request; a target under it cannot be met by
    any change to the graph's own code. The next column adds all of vLLM's serving work
    too (its API server's CPU per request: rendering, engine client, detokenizer, parsers,
    which the graph's tiers do as well, and its HTTP handling, which the floor's Ingress
    already counts): what a graph spends that does vLLM's work at vLLM's cost over
    Serve's hops. Idle: the floor's idle CPU over vLLM's.
    """
    vllm = next((r for r in runs if r.label == "vllm"), None)
    floor = next((r for r in runs if r.label == label), None)
    if vllm is None or floor is None:
        return []
    lines = [
        "| text | concurrency | floor ÷ vLLM | (floor + vLLM's engine) ÷ vLLM "
        "| (floor + vLLM's whole server) ÷ vLLM | target |",
        "|---|---|---|---|---|---|",
    ]
    for mode in modes(floor):
        for concurrency in concurrencies(runs):
            alone = _paired(floor, vllm, mode, concurrency, lambda f, v: cpu_ms(f) / cpu_ms(v))
            bound = _paired(
                floor,
                vllm,
                mode,
                concurrency,
                lambda f, v: (cpu_ms(f) + cpu_ms(v) - cpu_ms(v, engine=False)) / cpu_ms(v),
            )
            if bound:
                with_work = [1 + ratio for ratio in alone]
                lines.append(
                    f"| {mode} | {concurrency} | {spread(alone, '.2f')} | "
                    f"{spread(bound, '.2f')} | {spread(with_work, '.2f')} | "
                    f"≤ {CPU_TARGET[mode]}× |"
                )
    idle = sum(floor.idle_core_share.values()) - sum(vllm.idle_core_share.values())
    lines += [
        "",
        f"Idle: `{label}` takes {idle * 100:.1f}% of a core more than vLLM's server "
        f"(target for the graph: ≤ {IDLE_EXTRA_CORE * 100:.0f}%).",
    ]
    return lines


def report(args: argparse.Namespace, runs: Sequence[ServerRun]) -> str:
    argv = "python -m bench.requests"
    for name in ("tokens", "requests", "repeat", "idle_s"):
        argv += f" --{name.replace('_', '-')} {getattr(args, name)}"
    argv += " --concurrency " + ",".join(map(str, args.concurrency))
    argv += f" --servers {args.servers}" + "".join(f" --variant {v}" for v in args.variant)
    argv += " --in-turn" if args.in_turn else ""
    side_by_side = (
        "each server measured alone, one after another"
        if args.in_turn
        else "vLLM's server up beside each graph, their cells alternating within each round "
        "(the order reversed every other round) and the server not measured stopped "
        "(SIGSTOP of its whole tree): each ratio is between cells seconds apart"
    )
    out = [
        "# CPU per request: vLLM's server against the graph",
        "",
        f"Written by `{argv}` at commit {commit_id()}.",
        "",
        f"Host: {host_line()}. Load: streamed chats of {args.tokens} tokens "
        f"(temperature 0, `ignore_eos`), {args.requests} per cell in a closed loop at each "
        f"concurrency, after a warm-up; {args.repeat} rounds of every cell, {side_by_side}. "
        "Figures are the "
        "median over rounds, with the rounds' spread (min–max) in brackets.",
        "",
        "Servers:",
        "",
        *[f"- `{r.label}`: `{r.command}`" for r in runs],
        "",
        "CPU is every process of the server's tree (Ray's own included). vLLM's CPU engine "
        "spin-waits while it has work, so its engine's CPU grows with wall time: the column "
        "without the engine is the serving work alone.",
        "",
        "## Per cell",
        "",
        *cells_table(runs),
        "",
        "## CPU ms per request by process",
        "",
    ]
    for concurrency in concurrencies(runs):
        out += [f"Concurrency {concurrency}:", "", *by_kind_table(runs, concurrency), ""]
    if engine := engine_table(runs):
        out += [
            "## Inside the engine",
            "",
            "From vLLM's own metrics, read from each server's `/metrics` before and after "
            "each cell (`bench/requests/engine_view.py`): the means over the cell's "
            "requests of the time vLLM's engine client held each one (arrival to end, "
            "and to its first token), beside the same means at the client; requests "
            "in an engine at a time by Little's law (request rate × time there; the "
            "rest of the concurrency was on its way in or out), and vLLM's engine "
            "steps and the tokens each made.",
            "",
            *engine,
            "",
        ]
    out += [
        f"## Idle: % of one core over {args.idle_s:.0f} s without traffic",
        "",
        *idle_table(runs),
        "",
        "## Memory after the warm-up",
        "",
        *memory_table(runs),
        "",
        "## Targets (issue 27), graph against vLLM round by round",
        "",
        *targets_table(runs),
        "",
    ]
    if variants := variants_table(runs):
        out += ["## make-run against each variant", "", *variants, ""]
    floors = [(label, table) for label in FLOORS if (table := floor_table(runs, label))]
    if floors:
        out += [
            "## Serve's floor against the targets",
            "",
            "`floor` is the graph's hops with no vLLM (`bench/requests/floor_app.py`): an item "
            "per chunk on each hop, a 5 ms step. `floor-min` is the same at its least: a "
            "stream in two items (its first token, then the rest with its end, as the "
            "graph's step channel sends a short stream) and a 1.25 ms step, so its requests "
            "last about as long as vLLM's. The graph spends at least a floor plus an engine: "
            "the first bound takes the engine's CPU per request as vLLM's (at vLLM's rate) "
            "and all of vLLM's serving work as free; where `floor-min`'s is above a target, "
            "no change to the graph's own code meets that target while its tiers talk "
            "through Serve's handles. The second adds vLLM's whole server (its rendering, "
            "engine client, detokenizer and parsers, which the graph's tiers do too, and "
            "its HTTP handling, which the floor's Ingress already counts): a graph doing "
            "vLLM's work at vLLM's cost over Serve's least hops.",
            "",
        ]
        for label, table in floors:
            out += [f"`{label}`:", "", *table, ""]
    if any(r.label == FLOOR_ENGINE for r in runs):
        out += [
            "## The graph with none of its serving work",
            "",
            f"`{FLOOR_ENGINE}` is `floor-min` with vLLM's engine behind its Generate, started as "
            "the graph's Generate starts it: Serve's least hops, and vLLM's engine pacing "
            "the stream with its real steps, but no rendering, detokenizing or text. Its "
            "rows in the targets table above are measured, not bounds: its engine spins "
            "for the wall time Serve's hops add, as the graph's does. Where one is above a "
            "target, no graph over Serve's handles meets that target on this host, however "
            "little its tiers' own work costs.",
            "",
        ]
    return "\n".join(out)
