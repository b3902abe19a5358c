"""The report of ``bench.offload``: I against S per load, with the CPU behind each."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server
import matplotlib.pyplot as plt

from bench.harness.host import recorded_host_line
from bench.offload.load import Load
from bench.stats import percentile

NAMES = {"inline": "I", "tier": "S", "auto": "A"}
# The bar for auto: within 10% of the better fixed placement.
AUTO_WITHIN = 1.10
TEXT_SIDE = ("cpu-text", "head", "client")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


Cell = tuple[str, float, int]
"""(layout, engine step ms, concurrent streams)."""
LAYOUT_ORDER = {"disjoint": 0, "shared": 1}


def _cells(data: dict[str, Any]) -> dict[Cell, dict[str, list[dict[str, Any]]]]:
    cells: dict[Cell, dict[str, list[dict[str, Any]]]] = {}
    for r in data["rounds"]:
        cell = (r["layout"], r["pace_ms"], r["streams"])
        cells.setdefault(cell, {}).setdefault(r["placement"], []).append(r)
    return dict(sorted(cells.items(), key=lambda kv: (LAYOUT_ORDER.get(kv[0][0], 9), kv[0][1:])))


def _tpots(rounds: list[dict[str, Any]]) -> list[float]:
    return [q["tpot_ms"] for r in rounds for q in r["requests"] if q["tpot_ms"] is not None]


def _round_p50(r: dict[str, Any]) -> float | None:
    return percentile(_tpots([r]), 50)


def _tokens(r: dict[str, Any]) -> int:
    return sum(q["tokens"] for q in r["requests"] if q["ok"])


def _cores(rounds: list[dict[str, Any]], groups: tuple[str, ...]) -> float:
    """Cores the ``groups`` used on average over ``rounds``."""
    cpu = sum(sum(r["cpu_s"].get(g, {}).values()) for r in rounds for g in groups)
    return cpu / sum(r["wall_s"] for r in rounds)


def _kind_ms_per_token(rounds: list[dict[str, Any]], group: str, kind: str | None) -> float:
    cpu = sum(v for r in rounds for k, v in r["cpu_s"].get(group, {}).items() if kind in (None, k))
    return cpu / sum(_tokens(r) for r in rounds) * 1000


def cell_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    tpots, ttfts = (
        _tpots(rounds),
        [q["ttft_ms"] for r in rounds for q in r["requests"] if q["ttft_ms"] is not None],
    )
    requests = [q for r in rounds for q in r["requests"]]
    rates = [_tokens(r) / r["wall_s"] for r in rounds]
    return {
        "ok": sum(q["ok"] for q in requests),
        "requests": len(requests),
        "ttft_p50": percentile(ttfts, 50),
        "tpot_p50": percentile(tpots, 50),
        "tpot_p95": percentile(tpots, 95),
        "round_p50s": [_round_p50(r) for r in rounds],
        "tokens_per_s": sum(rates) / len(rates),
        "rates": rates,
        "engine_cores": _cores(rounds, ("engine",)),
        "text_cores": _cores(rounds, TEXT_SIDE),
        "engine_ms": _kind_ms_per_token(rounds, "engine", None),
        "generate_ms": _kind_ms_per_token(rounds, "engine", "Generate"),
        "engine_core_ms": _kind_ms_per_token(rounds, "engine", "EngineCore"),
        "derender_ms": _kind_ms_per_token(rounds, "cpu-text", "Derender"),
        "ingress_ms": _kind_ms_per_token(rounds, "cpu-text", "Ingress"),
        "head_ms": _kind_ms_per_token(rounds, "head", None),
        "client_ms": _kind_ms_per_token(rounds, "client", None),
    }


def ratio_rows(data: dict[str, Any]) -> list[str]:
    """S ÷ I per cell: pooled TPOT p50, the range of the rounds' own ratios (each
    round of S against the round of I next to it), and tokens/s."""
    rows, load = [], Load.recorded(data.get("args", {}))
    for (layout, pace, streams), by in _cells(data).items():
        if not {"inline", "tier"} <= set(by):
            continue
        i, s = cell_summary(by["inline"]), cell_summary(by["tier"])
        pairs = [
            b / a
            for a, b in zip(i["round_p50s"], s["round_p50s"], strict=False)
            if a is not None and b is not None
        ]
        spread = f"{min(pairs):.2f}–{max(pairs):.2f}" if pairs else "–"
        rows.append(
            f"| {layout} | {load.step_label(pace)} | {streams} "
            f"| {s['tpot_p50'] / i['tpot_p50']:.2f}× | {spread} "
            f"| {s['tokens_per_s'] / i['tokens_per_s']:.2f}× "
            f"| {s['ttft_p50'] / i['ttft_p50']:.2f}× | {auto_cells(by, i, s)} |"
        )
    return rows


def auto_cells(by: dict[str, list[dict[str, Any]]], i: dict[str, Any], s: dict[str, Any]) -> str:
    """A against the better of I and S: TPOT p50, tokens/s, and where A put its streams."""
    if "auto" not in by:
        return "– | – | –"
    a = cell_summary(by["auto"])
    tpot = auto_over_better(a, i, s)
    rate = a["tokens_per_s"] / max(i["tokens_per_s"], s["tokens_per_s"])
    met = "yes" if tpot <= AUTO_WITHIN else "no"
    return f"{tpot:.2f}× ({met}) | {rate:.2f}× | {tier_share(by['auto']):.0%}"


def auto_over_better(a: dict[str, Any], i: dict[str, Any], s: dict[str, Any]) -> float:
    """A's TPOT p50 over the lower of I's and S's (cell summaries): the issue's measure."""
    return float(a["tpot_p50"] / min(i["tpot_p50"], s["tpot_p50"]))


def tier_share(rounds: list[dict[str, Any]]) -> float:
    placed = [q.get("placed") for r in rounds for q in r["requests"]]
    return sum(p == "tier" for p in placed) / len(placed) if placed else 0.0


def ratio_table(data: dict[str, Any]) -> list[str]:
    return [
        "| cores | step ms | N streams | TPOT p50, S ÷ I | rounds' own ratios "
        "| tokens/s, S ÷ I | TTFT p50, S ÷ I | TPOT p50, A ÷ the better (≤ 1.10) "
        "| tokens/s, A ÷ the better | A's streams in the tier |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *ratio_rows(data),
    ]


def cell_rows(data: dict[str, Any]) -> list[str]:
    rows, load = [], Load.recorded(data.get("args", {}))
    for (layout, pace, streams), by in _cells(data).items():
        for placement in NAMES:
            if placement not in by:
                continue
            c = cell_summary(by[placement])
            rows.append(
                f"| {layout} | {load.step_label(pace)} | {streams} | {NAMES[placement]} "
                f"| {c['ok']} / {c['requests']} "
                f"| {_fmt(c['ttft_p50'], 0)} | {_fmt(c['tpot_p50'])} | {_fmt(c['tpot_p95'])} "
                f"| {c['tokens_per_s']:.0f} | {c['engine_cores']:.2f} | {c['text_cores']:.2f} "
                f"| {c['engine_ms']:.2f} | {c['generate_ms']:.2f} | {c['engine_core_ms']:.2f} "
                f"| {c['derender_ms']:.2f} | {c['ingress_ms']:.2f} | {c['head_ms']:.2f} "
                f"| {c['client_ms']:.2f} |"
            )
    return rows


def failure_lines(data: dict[str, Any]) -> list[str]:
    """Each cell's failed streams by what they got (none: no line)."""
    lines = []
    for (layout, pace, streams), by in _cells(data).items():
        for placement, rounds in by.items():
            errors = Counter(q.get("error") for r in rounds for q in r["requests"] if not q["ok"])
            for error, n in errors.most_common():
                lines.append(f"- {layout}, step {pace:g} ms, N {streams}, "
                             f"{NAMES[placement]}: {n} × `{error}`")  # fmt: skip
    return lines


def _phases(data: dict[str, Any]) -> list[tuple[int, str, dict[str, dict[str, Any]]]]:
    """The moving load's phases that every placement ran: (index, layout, by placement)."""
    phases: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for phase in data.get("moving") or []:
        phases.setdefault((phase["phase"], phase["layout"]), {})[phase["placement"]] = phase
    return [(i, layout, by) for (i, layout), by in sorted(phases.items()) if set(by) == set(NAMES)]


def _phase_p50s(by: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {name: percentile(_tpots([by[name]]), 50) or float("nan") for name in NAMES}


def moving_rows(data: dict[str, Any]) -> list[str]:
    """Per phase of the moving load: each placement's TPOT p50 and tokens/s, A against
    the better, and A's streams in the tier (in the phase's first 5 s, and after)."""
    rows = []
    for index, layout, by in _phases(data):
        p50 = _phase_p50s(by)
        rate = {name: _tokens(by[name]) / by[name]["wall_s"] for name in NAMES}
        auto_ratio = p50["auto"] / min(p50["inline"], p50["tier"])
        auto = by["auto"]["requests"]
        early = [q for q in auto if q["start_s"] < 5]
        late = [q for q in auto if q["start_s"] >= 5]
        ok = " / ".join(str(sum(q["ok"] for q in by[n]["requests"])) for n in NAMES)
        total = " / ".join(str(len(by[n]["requests"])) for n in NAMES)
        rows.append(
            f"| {index} | {layout} | {p50['inline']:.1f} | {p50['tier']:.1f} | {p50['auto']:.1f} "
            f"| {auto_ratio:.2f}× ({'yes' if auto_ratio <= AUTO_WITHIN else 'no'}) "
            f"| {rate['inline']:.0f} | {rate['tier']:.0f} | {rate['auto']:.0f} "
            f"| {_share(early)} | {_share(late)} | {ok} of {total} |"
        )
    return rows


def _share(requests: list[dict[str, Any]]) -> str:
    if not requests:
        return "–"
    return f"{sum(q['placed'] == 'tier' for q in requests) / len(requests):.0%}"


def moving_section(data: dict[str, Any]) -> list[str]:
    rows = moving_rows(data)
    if not rows:
        return []
    a = data["args"]
    return [
        "## A load that moves between them",
        "",
        f"{a['moving_streams']} clients in a closed loop, each streaming one chat "
        f"({a['moving_tokens']} tokens, the same parsed chat) after another, "
        f"{a['phase_s']:g} s per phase; between phases every process is pinned afresh "
        f"({' → '.join(a['moving'])}): the engine host's headroom taken and given back "
        "under a steady load. I, S and A each run the whole timeline, in turn. TPOT p50 "
        "(ms) over the phase's streams; tokens/s over the phase's wall time.",
        "",
        "| phase | cores | I TPOT p50 | S | A | A ÷ the better (≤ 1.10) | I tokens/s | S | A "
        "| A in the tier, first 5 s | after | ok (I / S / A) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def runs_section(work: Path) -> list[str]:
    """The other runs kept beside this one (``run-*.json``): the spread between runs."""
    rows = []
    for path in sorted(work.glob("run-*.json")):
        data = json.loads(path.read_text())
        load = Load.recorded(data.get("args", {}))
        for (layout, pace, streams), by in _cells(data).items():
            if not {"inline", "tier"} <= set(by):
                continue
            i, s = cell_summary(by["inline"]), cell_summary(by["tier"])
            auto = "–"
            if "auto" in by:
                auto = f"{auto_over_better(cell_summary(by['auto']), i, s):.2f}×"
            rows.append(f"| {path.stem} | {layout} | {load.step_label(pace)} | {streams} "
                        f"| {s['tpot_p50'] / i['tpot_p50']:.2f}× | {auto} |")  # fmt: skip
        for index, layout, phased in _phases(data):
            p50 = _phase_p50s(phased)
            better = min(p50["inline"], p50["tier"])
            rows.append(f"| {path.stem} | moving, phase {index}: {layout} | – | – "
                        f"| {p50['tier'] / p50['inline']:.2f}× "
                        f"| {p50['auto'] / better:.2f}× |")  # fmt: skip
    if not rows:
        return []
    return [
        "## The other runs",
        "",
        "Earlier runs of this command, kept beside its results (`run-*.json`): TPOT p50, "
        "S ÷ I and A ÷ the better of the two, per cell (`run-i-s-*`: before A existed).",
        "",
        "| run | cores | step ms | N | S ÷ I | A ÷ the better |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def pinning_rows(pinning: list[dict[str, Any]]) -> list[str]:
    counts = Counter((p["group"], p["cores"]) for p in pinning)
    kinds: dict[tuple[str, str], set[str]] = {}
    for p in pinning:
        title = p["title"]
        short = title.split()[0].rsplit("/", 1)[-1] if title else "?"
        kinds.setdefault((p["group"], p["cores"]), set()).add(short[:48])
    return [
        f"| {group} | {cores} | {n} | {', '.join(sorted(kinds[(group, cores)])[:8])} |"
        for (group, cores), n in sorted(counts.items())
    ]


def plot(data: dict[str, Any], path: Path) -> None:
    cells = _cells(data)
    lines = sorted({(layout, pace) for layout, pace, _ in cells},
                   key=lambda lp: (LAYOUT_ORDER.get(lp[0], 9), lp[1]))  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for layout, pace in lines:
        ns = sorted(n for lay, p, n in cells if (lay, p) == (layout, pace))
        for placement, name in NAMES.items():
            if any(placement not in cells[(layout, pace, n)] for n in ns):
                continue
            summaries = [cell_summary(cells[(layout, pace, n)][placement]) for n in ns]
            p50s = [s["tpot_p50"] for s in summaries]
            spans = [[x for x in s["round_p50s"] if x is not None] for s in summaries]
            low = [p - min(xs) for p, xs in zip(p50s, spans, strict=True)]
            high = [max(xs) - p for p, xs in zip(p50s, spans, strict=True)]
            style = {"S": "-", "I": "--", "A": ":"}[name]
            label = f"{name}, {layout} cores, step {pace:g} ms"
            axes[0].errorbar(ns, p50s, yerr=[low, high], marker="o", capsize=3, ls=style,
                             label=label)  # fmt: skip
            axes[1].plot(ns, [s["text_cores"] for s in summaries], marker="s", ls=style,
                         label=label)  # fmt: skip
    axes[0].set_xlabel("concurrent streams")
    axes[0].set_ylabel("TPOT p50 ms (bars: rounds' p50 range)")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel("concurrent streams")
    axes[1].set_ylabel("cores used off the engine node\n(CPU node, head, client)")
    axes[1].set_ylim(bottom=0)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(data: dict[str, Any], out: Path) -> None:
    image = out.with_suffix(".png")
    plot(data, image)
    a, load = data["args"], Load.recorded(data["args"])
    engine = ",".join(map(str, a["engine_cores"]))
    text = ",".join(map(str, a["text_cores"]))
    lines = [
        "# Where the derender tier wins: an engine host short of CPU",
        "",
        f"`python -m bench.offload --pace-ms {','.join(f'{p:g}' for p in a['pace_ms'])} "
        f"--streams {','.join(map(str, a['streams']))} --rounds {a['rounds']}{load.flags()} "
        f"--out {out}` "
        f"(results in `{out.with_suffix('')}/`)",
        "",
        f"Host: {recorded_host_line(data['host'])}. A local Ray cluster "
        "shaped like `k8s/overlays/cpu` (`bench/harness/cluster.py`), one node per group, "
        "in two layouts (`bench/harness/pinning.py`). *disjoint*: the engine node's "
        "processes (the Generate replica, vLLM's engine core and worker) on core "
        f"{engine}; the CPU node's (Ingress, Render, Derender), the head's (Serve's "
        f"controller, HAProxy) and the load's client on core {text}. *shared*: every "
        "process on every core, as on one host. Every engine step is held the cell's "
        f"*step* ({load.step_text()}) on top of the tiny model's own work. One "
        "deployment serves both placements, chosen per request (`X-Text-Placement`): "
        "**I** makes text in the Generate replica, next to the engine; **S** in the "
        "Derender tier; **A** (`auto`) lets the Ingress choose per request from the "
        "replicas' host load (`deployments/routing/text_placement.py`). A cell is N "
        f"streamed chats at once ({a['tokens']} tokens each, `ignore_eos`, reasoning at "
        "temperature 1 with a tool offered: the qwen3 reasoning and hermes tool parsers "
        f"on every token{load.stream_text()}), the placements in turn, {a['rounds']} "
        "rounds each (the order rotated every round). "
        "TPOT is vLLM's benchmark's: (end − first text) ÷ (tokens − 1), so text a parser "
        "holds back counts when it arrives.",
        "",
        "## S against I, and A against the better of the two",
        "",
        *ratio_table(data),
        "",
        f"![TPOT and cores]({image.name})",
        "",
        "## Per cell",
        "",
        "TTFT and TPOT (ms) over every stream of the cell's rounds; tokens/s: completed output "
        "tokens over the round's wall time, averaged over rounds. *Cores*: CPU seconds over "
        "wall seconds, the engine node's processes and the rest (the CPU node, the head and "
        "the client): in *disjoint*, each on its own core. CPU ms per output token: the engine "
        "node in all, the Generate replica, vLLM's engine core (whose spin-wait fills "
        "whatever its core leaves idle), then Derender, Ingress, the head and the client.",
        "",
        "| cores | step ms | N | | ok | TTFT p50 | TPOT p50 | TPOT p95 | tokens/s "
        "| engine cores | other cores | engine node ms/tok | Generate | EngineCore "
        "| Derender | Ingress | head | client |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *cell_rows(data),
        "",
        *(["Failed streams:", "", *failure_lines(data), ""] if failure_lines(data) else []),
        *moving_section(data),
        *runs_section(out.with_suffix("")),
        "## Where each process ran",
        "",
        "Read back from `/proc/<pid>/status` (`Cpus_allowed_list`, every thread) after each "
        "layout's last round; the run fails if any process is off its group's cores.",
        "",
    ]
    for layout, pinning in data["pinning"].items():
        lines += [
            f"*{layout}*:",
            "",
            "| node | cores | processes | e.g. |",
            "|---|---|---|---|",
            *pinning_rows(pinning),
            "",
        ]
    # The reading of a run: words, no figures (every figure above is read from the results).
    findings = out.with_suffix("") / "findings.md"
    if findings.exists():
        lines += [findings.read_text()]
    out.write_text("\n".join(lines))
