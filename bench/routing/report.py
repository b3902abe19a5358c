"""``docs/routing.md`` and its plot, from one ``bench.routing`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server
import matplotlib.pyplot as plt

from bench.routing.results import Result
from bench.stats import percentile


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def rows(results: list[Result]) -> list[str]:
    out = [
        "| graph | workload | requests | failed | prefix-cache hit rate | TTFT p50 ms "
        "| TTFT p95 ms | TTFT p50 ms per pass | requests per replica "
        "| later turns on the first turn's replica "
        "| TTFT p50 ms, first turns / later turns |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        failed = sum(1 for t in r.turns if t.error)
        per = " / ".join(str(n) for n in r.per_replica())
        shared = r.workload == "shared"
        stayed = _pct(r.stayed()) if shared else "–"
        by_turn = f"{_ms(_turn_p50(r, first=True))} / {_ms(_turn_p50(r, first=False))}"
        out.append(
            f"| {r.run} | {r.workload} | {len(r.turns)} | {failed} | {_pct(r.hit_rate)} "
            f"| {_ms(r.ttft(50))} | {_ms(r.ttft(95))} | {_per_pass(r)} | {per} | {stayed} "
            f"| {by_turn if shared else '–'} |"
        )
    return out


def _turn_p50(result: Result, first: bool) -> float | None:
    """TTFT p50 of first turns (a miss on every graph: the system prompt is new) or of
    later turns (a hit where the turn finds its conversation's blocks)."""
    return percentile(
        [t.ttft_ms for t in result.turns if t.ttft_ms is not None and (t.turn == 0) == first],
        50,
    )


def _per_pass(result: Result) -> str:
    """TTFT p50 of each pass (a pass's conversations are numbered from 100,000 × (pass + 1))."""
    passes: dict[int, list[float]] = {}
    for t in result.turns:
        if t.ttft_ms is not None:
            passes.setdefault(t.conversation // 100_000, []).append(t.ttft_ms)
    return ", ".join(_ms(percentile(v, 50)) for _, v in sorted(passes.items()))


def _find(results: list[Result], run: str, workload: str) -> Result | None:
    return next((r for r in results if r.run == run and r.workload == workload), None)


def targets(results: list[Result]) -> list[str]:
    """Issue 14's targets, for the row groups this run has."""
    one = _find(results, "1 replica", "shared")
    pow2, prefix = _find(results, "pow2", "shared"), _find(results, "prefix", "shared")
    pow2_u, prefix_u = _find(results, "pow2", "unique"), _find(results, "prefix", "unique")
    lines = ["| target (issue 14) | measured | met |", "|---|---|---|"]

    def row(name: str, text: str, ok: bool) -> None:
        lines.append(f"| {name} | {text} | {'yes' if ok else 'no'} |")

    if one and prefix and prefix.hit_rate is not None and one.hit_rate is not None:
        gap = 100 * (one.hit_rate - prefix.hit_rate)
        row(
            "shared: hit rate, prefix within 5 points of 1 replica",
            f"{gap:+.1f} points below",
            gap <= 5,
        )
    if pow2 and prefix and (ttft_p := prefix.ttft(50)) is not None and (ttft_2 := pow2.ttft(50)):
        row(
            "shared: TTFT p50, prefix ÷ pow2 ≤ 0.70",
            f"{ttft_p / ttft_2:.2f}×",
            ttft_p / ttft_2 <= 0.70,
        )
    if (
        pow2_u
        and prefix_u
        and (ttft_pu := prefix_u.ttft(50)) is not None
        and (ttft_2u := pow2_u.ttft(50))
    ):
        ratio = ttft_pu / ttft_2u
        row("unique: TTFT p50, prefix ÷ pow2 within 10%", f"{ratio:.2f}×", abs(ratio - 1) <= 0.10)
    if (
        pow2_u
        and prefix_u
        and (share_p := _busiest_share(prefix_u))
        and (share_2 := _busiest_share(pow2_u))
    ):
        ratio = share_p / share_2
        row(
            "unique: busiest replica's share, prefix ÷ pow2 within 10%",
            f"{share_p:.2f} ÷ {share_2:.2f} = {ratio:.2f}×",
            ratio <= 1.10,
        )
    return lines


def _busiest_share(result: Result) -> float | None:
    per = result.per_replica()
    return per[0] / sum(per) if per else None


def plot(results: list[Result], path: Path) -> None:
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for number, r in enumerate(x for x in results if x.workload == "shared"):
        values = sorted(t.ttft_ms for t in r.turns if t.ttft_ms is not None)
        ys = [(i + 1) / len(values) for i in range(len(values))]
        cdf.step(values, ys, where="post", label=r.run, color=f"C{number}")
    cdf.set_xscale("log")
    cdf.set_xlabel("TTFT ms (shared-prefix conversations)")
    cdf.set_ylabel("share of requests")
    cdf.grid(True, alpha=0.3)
    cdf.legend()
    shared = [r for r in results if r.workload == "shared"]
    bars.bar(
        [r.run for r in shared],
        [100 * (r.hit_rate or 0) for r in shared],
        color=[f"C{i}" for i in range(len(shared))],
    )
    bars.set_ylabel("prefix-cache hit rate % (engines' own counters)")
    bars.set_ylim(0, 100)
    bars.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results: list[Result], args: Any, command: str, out: Path) -> None:
    image = out.with_suffix(".png")
    plot(results, image)
    text = [
        "# Prefix routing: two Generate replicas, `prefix` against `pow2`",
        "",
        f"`{command}`",
        "",
        f"Host: {args.host}. Topology I (inline text), "
        + (
            "`bench.prefill_model`'s model (the embedded model's tokenizer, 8x its weights "
            "per token, random weights: a prefill of real shape, noise for text)"
            if getattr(args, "prefill_heavy", False)
            else "the embedded model"
        )
        + ": one Serve instance "
        "runs one app of it per row group, side by side (each engine 1 GiB of KV cache: "
        "nothing is evicted), each warmed with 8 short and 8 full-length one-turn "
        "requests. Only one app has load at a time: each pass runs on every app in turn, the "
        "order reversed on every other pass. "
        + (
            f"Each engine's threads bound to {args.cpu_cores} core(s) of its own "
            "(`generate.cpu_cores`); the apps take turns, so engines of one app never share. "
            if getattr(args, "cpu_cores", None)
            else "Engine threads unbound: the engines of an app share both cores. "
        )
        + (
            "*prefix/history*: prefix routing on what each router itself sent where, "
            "without the engines' events. "
            if any(r.run == "prefix/history" for r in results)
            else ""
        )
        + f"*shared*: {args.conversations} conversations, each over its own system "
        f"prompt of {args.system_words} words, {args.turns} turns, starts Poisson at "
        f"{args.start_rps:g}/s, think time exponential with mean {args.think_s:g} s, answers "
        f"of at most {args.max_tokens} tokens. *unique*: {args.unique} one-turn requests, "
        f"every system prompt its own, Poisson at {args.unique_rps:g}/s. {args.repeat} passes "
        "(shared, then unique), each with prompts of its own, the same on every app; a row "
        f"pools its passes. Seed {args.seed}.",
        "",
        "Hit rate: the engines' `vllm:prefix_cache_hits` ÷ `vllm:prefix_cache_queries` over "
        "the workload, summed over engines (tokens). TTFT: from sending to the first chunk "
        "with output, at the client. Requests per replica: by `X-Served-By`.",
        "",
        *rows(results),
        "",
        *targets(results),
        "",
        f"![TTFT and hit rate]({image.name})",
        "",
    ]
    out.write_text("\n".join(text))
