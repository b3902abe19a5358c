"""Write ``docs/experiments.md`` from results directories; no number is typed in.

    python -m bench.doc --grid docs/experiments/cpu --ramp docs/experiments/ramp \\
        --crosscheck docs/experiments/crosscheck \\
        --findings docs/experiments/findings.md --out docs/experiments.md

The prose that frames any run lives here, and a reading of one run in
``--findings`` (words, no figures); every figure, table and ratio is read
from the results (``spec.json``, ``cells.json``, ``timeline.json``,
``requests.jsonl``, ``crosscheck.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.offload.load import Load
from bench.offload.report import ratio_table
from bench.report import cpu_per_1k_table, load, load_table, markdown_table
from bench.topology import CONFIGS
from deployments.config.topologies import app_config

SHAPE_RANGES = {"chat": (128, 512), "tools": (64, 256), "reasoning": (2048, 8192)}


def command_of(spec: dict[str, Any], out: Path) -> str:
    """The ``python -m bench run`` line that reproduces a results directory."""
    parts = [
        "python -m bench run",
        f"--topologies {','.join(spec['topologies'])}",
        f"--shapes {','.join(spec['shapes'])}",
    ]
    if spec["ramp"]:
        parts.append("--ramp " + ",".join(f"{p['rps']:g}:{p['seconds']:g}" for p in spec["ramp"]))
    else:
        seed_rps = [r / spec["rate_scale"] for r in spec["rps"]]
        parts += [
            "--rps " + ",".join(f"{r:g}" for r in seed_rps),
            f"--rate-scale {spec['rate_scale']:g}",
            f"--duration {spec['duration_s']:g}",
        ]
    parts += [f"--length-scale {spec['length_scale']:g}", f"--out {out}"]
    parts += [f"--set {key}={value}" for key, value in spec.get("set_args", {}).items()]
    if spec.get("url"):
        parts.append(f"--url {spec['url']}")
    if spec.get("profile", "local") != "local":
        parts.append(f"--profile {spec['profile']}")
    return " \\\n    ".join(parts)


def scale_text(spec: dict[str, Any]) -> str:
    ranges = ", ".join(
        f"{shape} {round(low * spec['length_scale'])}–{round(high * spec['length_scale'])}"
        for shape, (low, high) in SHAPE_RANGES.items()
        if shape in spec["shapes"]
    )
    return (
        f"Length scale {spec['length_scale']:g} (output tokens: {ranges}); "
        f"rate scale {spec['rate_scale']:g} (rates as run: "
        f"{'/'.join(f'{r:g}' for r in spec['rps'])} rps); {spec['duration_s']:g} s of "
        f"{'Poisson' if spec['poisson'] else 'constant'} arrivals per cell, seed "
        f"{spec['seed']}, drain budget {spec['drain_s']:g} s."
    )


def ratios(cells: list[dict[str, Any]], mine: str, theirs: str, metric: str) -> str:
    """``shape @rps: x.xx×`` for every cell both topologies drained."""
    by_key = {(c["topology"], c["shape"], c["rps"]): c for c in cells}
    out = []
    for c in cells:
        if c["topology"] != mine:
            continue
        other = by_key.get((theirs, c["shape"], c["rps"]))
        if other is None:
            continue
        if not (c["drained"] and other["drained"]):
            state = "did not drain" if not other["drained"] else f"{mine} did not drain"
            out.append(f"{c['shape']} @{c['rps']:g}: {theirs} {state}")
        elif c[metric] and other[metric]:
            out.append(f"{c['shape']} @{c['rps']:g}: {c[metric] / other[metric]:.2f}×")
    return "; ".join(out)


def ramp_section(ramp_dir: Path, image_dir: str) -> str:
    spec, _, timeline = load(ramp_dir)
    rows = [json.loads(line) for line in (ramp_dir / "requests.jsonl").read_text().splitlines()]
    cell = timeline["cells"][0]
    ((topology, samples),) = timeline["samples"][0].items()
    lines = [
        "| phase | rps | seconds | requests | completed | failed | Derender replicas (min–max) |",
        "|---|---|---|---|---|---|---|",
    ]
    start = 0.0
    for i, phase in enumerate(spec["ramp"], 1):
        end = start + phase["seconds"]
        issued = [r for r in rows if start <= r["scheduled_s"] < end]
        window = [
            s.get("Derender", 0)
            for s in samples
            if cell["start_s"] + start <= s["t_s"] <= cell["start_s"] + end
        ]
        span = f"{min(window)}–{max(window)}" if window else "–"
        lines.append(
            f"| {i} | {phase['rps']:g} | {phase['seconds']:g} | {len(issued)} | "
            f"{sum(r['error'] is None for r in issued)} | "
            f"{sum(r['error'] is not None for r in issued)} | {span} |"
        )
        start = end
    after = [s.get("Derender", 0) for s in samples if s["t_s"] > cell["start_s"] + start]
    total_failed = sum(r["error"] is not None for r in rows)
    scaling = app_config(CONFIGS / f"{topology}.yaml")["args"]["derender"]["autoscaling"]
    return (
        f"Topology {topology}, shape {', '.join(spec['shapes'])}; the Derender tier on "
        f"`configs/{topology}.yaml`'s autoscaling (min {scaling['min_replicas']}, max "
        f"{scaling['max_replicas']}, target {scaling['target_ongoing_requests']} ongoing "
        "requests per replica).\n\n"
        f"```\n{command_of(spec, ramp_dir)}\n```\n\n"
        + "\n".join(lines)
        + f"\n\nRequests failed over the whole ramp: **{total_failed}** of {len(rows)}. "
        f"Derender replicas after the last phase (drain and scale-in): "
        f"{' → '.join(str(n) for n in _runs(after)) or 'not sampled'}.\n\n"
        f"![replica timeline]({image_dir}/replicas.png)\n"
    )


def _runs(values: list[int]) -> list[int]:
    """Consecutive duplicates dropped: 3,3,2,2,1 → 3,2,1."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def host_text(spec: dict[str, Any]) -> str:
    """The run's host as recorded; runs from before it was recorded name this one."""
    host = spec.get("host") or {
        "machine": platform.machine(), "cpus": os.cpu_count(), "system": platform.system()
    }  # fmt: skip
    recorded = "" if "host" in spec else " (where this doc was written)"
    return f"{host['machine']}, {host['cpus']} CPUs, {host['system']}{recorded}"


@dataclass(frozen=True)
class Sources:
    """The results folders (and the prose) a page is written from."""

    grid: Path
    ramp: Path | None = None
    crosscheck: Path | None = None
    findings: Path | None = None
    offload: Path | None = None


def doc_command(sources: Sources, out: Path) -> str:
    given = [f"--{name} {path}" for name, path in vars(sources).items() if path is not None]
    return " \\\n    ".join(["python -m bench.doc", *given, f"--out {out}"])


def offload_section(results: Path, out: Path) -> str:
    """``bench.offload``'s S ÷ I table, read from its results, with its page's link."""
    data = json.loads((results / "results.json").read_text())
    step_load = Load.recorded(data.get("args", {}))
    step = "/".join(f"{p:g}" for p in data.get("args", {}).get("pace_ms", [15.0]))
    page = os.path.relpath(results.with_suffix(".md"), out.parent)
    image = os.path.relpath(results.with_suffix(".png"), out.parent)
    return "\n".join(
        [
            "The cells above share this host's 2 cores among every tier, so the tier's work "
            "is never moved off the engine's CPU. `python -m bench.offload` runs one "
            "deployment on a local cluster whose engine node has a core of its own "
            "(*disjoint*), then with every process on both cores (*shared*), I, S and A "
            "(`text_placement: auto`, the Ingress's choice per request) on the same load, "
            f"each engine step {step} ms long ({step_load.step_text()}); the page with "
            "every cell, the CPU behind it, a load that moves between the two and where "
            f"each process ran: [{page}]({page}).\n",
            *ratio_table(data),
            f"\n![TPOT and cores]({image})\n",
        ]
    )


def write_doc(sources: Sources, out: Path) -> str:
    grid, ramp, crosscheck = sources.grid, sources.ramp, sources.crosscheck
    findings, offload = sources.findings, sources.offload
    spec, cells, _ = load(grid)
    rel = os.path.relpath(grid, out.parent)
    parts = [
        "# Experiments: inline vs tiered text on this graph\n",
        "The seed's TTFT/TPOT table (vLLM PR #58588) reproduced on the "
        "Ray Serve graph, with two more columns: **S**, the stateful streamed derender tier, "
        "and **I**, the same stream derenderer inline in the Generate replica. Written by "
        "`python -m bench.doc` from the results directories; no number here is typed in:\n",
        f"```\n{doc_command(sources, out)}\n```\n",
        "## How it was run\n",
        f"Host: {host_text(spec)}; "
        + (
            f"model `{spec['model']}` on the GPU profile (`configs/gpu.yaml`). "
            if spec.get("profile") == "gpu"
            else "the tiny model the repo builds (`models/tiny-chat`) on a vLLM-CPU engine. "
        )
        + (
            f"Every client ran against one graph at {spec['url']}.\n"
            if spec.get("url")
            else "Each topology started from its config in `configs/` with `serve run`, "
            "one after another.\n"
        ),
        f"```\n{command_of(spec, grid)}\n```\n",
        scale_text(spec) + "\n",
        "TTFT and TPOT are measured client-side as in the seed: TTFT from sending the "
        "first request of the flow (render included) to the first chunk carrying output; "
        "TPOT = (last delta − first delta) / (output_tokens − 1), with output_tokens from "
        "the engine's usage.\n",
        "## Results: TTFT p50/p95 | TPOT p50/p95 (ms)\n",
        markdown_table(spec, cells),
        "\nRequests, output throughput and CPU seconds per tier (each tier's processes, "
        "Generate including its engine):\n",
        load_table(cells),
        "\nCPU seconds per 1,000 output tokens delivered, *Generate* (its replica and "
        "engine processes) */ all tiers* (every replica and Serve's proxy), per cell. "
        "A cell that did not drain counts only the tokens of its completed requests:\n",
        cpu_per_1k_table(spec, cells),
        f"\n![TTFT and TPOT against rate]({rel}/latency.png)\n",
        f"![Replicas per deployment, per topology run]({rel}/replicas.png)\n",
        "## S against T and B, computed from the table\n",
        f"- TTFT p50, S / T: {ratios(cells, 'S', 'T', 'ttft_p50_ms')}.",
        f"- TPOT p50, S / T: {ratios(cells, 'S', 'T', 'tpot_p50_ms')}.",
        f"- TTFT p50, S / B: {ratios(cells, 'S', 'B', 'ttft_p50_ms')}.",
        f"- TPOT p50, S / B: {ratios(cells, 'S', 'B', 'tpot_p50_ms')}.",
        f"- TTFT p50, I / T: {ratios(cells, 'I', 'T', 'ttft_p50_ms')}.",
        f"- TTFT p50, S / I: {ratios(cells, 'S', 'I', 'ttft_p50_ms')}.",
        f"- TPOT p50, S / I: {ratios(cells, 'S', 'I', 'tpot_p50_ms')}.\n",
    ]
    if findings is not None:
        parts += [findings.read_text()]
    if offload is not None:
        parts += ["## Where the tier wins: the engine on a core of its own\n",
                  offload_section(offload, out)]  # fmt: skip
    if ramp is not None:
        parts += ["## Autoscaling ramp\n", ramp_section(ramp, os.path.relpath(ramp, out.parent))]
    if crosscheck is not None:
        run = json.loads((crosscheck / "spec.json").read_text())
        flags = " ".join(
            f"--{key.replace('_', '-')} {value}"
            for key, value in run.items()
            if value is not None and key != "model"
        )
        parts += [
            "## Cross-check against vLLM's benchmark client\n",
            f"```\npython -m bench.crosscheck {flags}\n```\n",
            (crosscheck / "crosscheck.md").read_text(),
        ]
    parts += [NOTES]
    text = "\n".join(parts)
    out.write_text(text)
    return text


NOTES = """## Caveats

- A CPU engine and a tiny model: the engine's per-token cost is far below a GPU
  model's relative to the serving stack's, so the stack (HTTP proxy, handle hops,
  parsers) weighs more here than on the seed's A100. The ratios between columns,
  not the milliseconds, are what carries over.
- One run per cell, on a shared 2-core host where the client, the Ray processes
  and the engines compete for the same cores; the client runs at normal priority
  and Ray's workers at nice 15.
- The seed's BP column cannot serve tools (a parser-less render rejects tool
  requests with 400); its tools cells here show the same.
- Reasoning cells at the higher rates exceed what this host sustains for every
  topology; the seed did not attempt reasoning above 1 rps.

## Reproduce on a GPU

The GPU profile (`configs/gpu.yaml`: Qwen/Qwen3-8B, one GPU per Generate
replica, qwen3 + hermes parsers) with each topology's switches, at the seed's
lengths and rates:

```
python -m bench run --profile gpu --topologies G,T,B,BP,S,I \\
    --shapes chat,tools,reasoning --rps 0.5,2,6 --duration 300 --out results/gpu
```
"""


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("--grid", type=Path, required=True)
    cli.add_argument("--ramp", type=Path, default=None)
    cli.add_argument("--crosscheck", type=Path, default=None)
    cli.add_argument("--findings", type=Path, default=None, help="reading of the run (prose)")
    cli.add_argument("--offload", type=Path, default=None,
                     help="bench.offload's results folder (next to its page, NAME.md)")  # fmt: skip
    cli.add_argument("--out", type=Path, default=Path("docs/experiments.md"))
    args = cli.parse_args()
    sources = Sources(args.grid, args.ramp, args.crosscheck, args.findings, args.offload)
    write_doc(sources, args.out)


if __name__ == "__main__":
    main()
